"""What the bridge tests share: a one-call task run by the shell harness in bwrap, and a
stand-in for rolloutd's client that answers canned groups (rolloutd's own types) for the tests
that put a bridge's rows through a trainer's own code without fleets."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

#: chat calls through the gateway, one conversation: the instruction, then (with a second
#: argument N > 1) "Say it again." after each reply, N calls in all; the last reply is written
#: to reply.txt. Two calls make one trace whose second user turn is not sampled (mask 0).
ASK_PY = r"""
import json, os, sys, urllib.request
messages = [{"role": "user", "content": sys.argv[1]}]
for turn in range(int(sys.argv[2]) if len(sys.argv) > 2 else 1):
    if turn:
        messages.append({"role": "user", "content": "Say it again."})
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps({"model": "m", "messages": messages}).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    reply = json.load(urllib.request.urlopen(request, timeout=600))
    content = reply["choices"][0]["message"]["content"] or ""
    messages.append({"role": "assistant", "content": content})
open("reply.txt", "w").write(content)
"""

#: the trainers' environments built by scripts/setup_trainers.sh
TRAINERS_DIR = Path(
    os.environ.get("ROLLOUTD_TRAINERS_DIR", Path.home() / ".cache" / "rolloutd" / "trainers")
)
INSTALL = (
    "scripts/setup.sh installs trl and verifiers, scripts/setup_trainers.sh the others "
    "(docs/trainers.md, 'Installing')"
)


def have(module: str) -> bool:
    """Whether ``module`` imports in this environment (without importing it)."""
    return importlib.util.find_spec(module) is not None


def trainer_python(name: str) -> Path:
    """The interpreter of a trainer's own environment (``verl``, ``skyrl``)."""
    return TRAINERS_DIR / name / "bin" / "python"


def ask_task(max_tokens: int = 16, turns: int = 1) -> dict:
    """Task fields of ``turns`` chat calls in one conversation by the shell harness in bwrap,
    scored 1.0 when the harness ran to its end (``session_completed``)."""
    return {
        "harness": {"type": "shell", "command": f"python3 ask.py {{instruction}} {turns}"},
        "runtime": {"type": "bwrap", "files": {"ask.py": ASK_PY}},
        "evaluator": {"type": "session_completed"},
        "sampling": {"temperature": 1.0, "max_tokens": max_tokens},
    }


def canned_trace(prompt, response, mask, reward=None):
    """A trace of the given tokens: logprob -0.5 on each sampled token, a completion starting
    at each run of sampled tokens."""
    from rolloutd.types import Trace

    return Trace(
        prompt_ids=prompt,
        response_ids=response,
        loss_mask=mask,
        response_logprobs=[-0.5 if m else 0.0 for m in mask],
        completion_indices=[i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])],
        reward=reward,
    )


class FakeClient:
    """A stand-in for rolloutd's client (rolloutd's own types, canned): ``submit`` answers
    the canned group of the task's instruction, ``trajectory`` its stored trajectory.

    Args:
        groups_by_instruction: instruction -> one ``(status, reward, failure, trace)`` per
            sample.
    """

    def __init__(self, groups_by_instruction):
        self.groups_by_instruction = groups_by_instruction
        self.trajectories = {}
        self.store = None  # RolloutClient.store: the canned traces carry no routed experts
        self.requests = []

    async def submit(self, request):
        from rolloutd.types import SessionResult, TaskResult, Trajectory

        self.requests.append(request)
        sessions = []
        for index, (status, reward, failure, trace) in enumerate(
            self.groups_by_instruction[request["instruction"]]
        ):
            session_id = f"{request['task_id']}/{index}"
            sessions.append(
                SessionResult(
                    session_id=session_id,
                    task_id=request["task_id"],
                    sample_index=index,
                    status=status,
                    reward=reward,
                    failure=failure,
                    trajectory_ref=session_id,
                )
            )
            self.trajectories[session_id] = Trajectory(
                session_id=session_id, task_id=request["task_id"], traces=[trace]
            )
        group = TaskResult(task_id=request["task_id"], sessions=sessions)

        class Handle:
            async def result(self):
                return group

        return Handle()

    def trajectory(self, session):
        return self.trajectories[session.trajectory_ref]
