"""A real LocalStack for the reliability tests: Temporal dev server (SQLite), llama-server,
and each fleet as its own child process; a recording proxy (Tee) between gateway and engine
counts what llama-server really answered.

Everything started here is stopped by its id at the end of the test session.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rolloutd.stack import RestartPolicy, free_port
from rolloutd.stack.local import LocalStack
from tests.support.procs import processes_with  # noqa: F401  (re-exported to the tests)

#: the repository (its ``tests`` package is imported by the fleets' children too).
REPO = Path(__file__).resolve().parents[2]

#: the harness: a small agent loop making real chat calls through the session's gateway URL,
#: with pauses so that kills land mid-session. A call that fails on the wire or with a 5xx is
#: retried with the identical body (the gateway answers an answered request from its log).
#: With ``AGENT_TOOL`` in the runtime's env, each turn runs that shell command (its tool) and
#: sends its output back with the next request.
AGENT = r"""
import json, os, subprocess, sys, time, urllib.error, urllib.request
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
num_calls, pause_s = int(sys.argv[1]), float(sys.argv[2])
tool = os.environ.get("AGENT_TOOL")
messages = [{"role": "user", "content": "Say one short word."}]
ids = []
for turn in range(num_calls):
    body = json.dumps({"model": "m", "max_tokens": 8, "temperature": 0,
                       "messages": messages}).encode()
    for attempt in range(120):
        request = urllib.request.Request(base + "/chat/completions", data=body, headers={
            "Authorization": "Bearer " + key, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                reply = json.load(response)
            break
        except urllib.error.HTTPError as e:
            if e.code < 500:
                raise
            print("retry after", e.code, file=sys.stderr, flush=True)
        except (urllib.error.URLError, OSError) as e:
            print("retry after", repr(e), file=sys.stderr, flush=True)
        time.sleep(1)
    else:
        sys.exit("gave up")
    ids.append(reply["id"])
    message = reply["choices"][0]["message"]
    follow = "Another word."
    if tool:
        out = subprocess.run(tool, shell=True, capture_output=True, text=True).stdout.strip()
        follow = f"The tool printed {out}. " + follow
    messages += [{"role": "assistant", "content": message.get("content") or ""},
                 {"role": "user", "content": follow}]
    time.sleep(pause_s)
print("IDS " + json.dumps(ids), flush=True)
"""

NUM_CALLS = 3

#: the marks of every reliability test: a local stack with the real engine and sandbox
STACK_MARKS = [pytest.mark.slow, pytest.mark.temporal, pytest.mark.engine, pytest.mark.sandbox]


def agent_task(
    task_id: str,
    marker: str,
    *,
    num_samples: int = 8,
    pause_s: float = 2.0,
    prepare: list[dict[str, Any]] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """A task whose sessions run :data:`AGENT` in a bwrap runtime (after the runtime's
    ``prepare`` steps, if given); ``marker`` is on the harness's command line so leftover
    processes can be counted from /proc. ``overrides`` replace TaskRequest fields."""
    task: dict[str, Any] = {
        "task_id": task_id,
        "instruction": "reliability",
        "num_samples": num_samples,
        "harness": {"type": "shell", "command": f"python3 agent.py {NUM_CALLS} {pause_s} {marker}"},
        "runtime": {"type": "bwrap", "files": {"agent.py": AGENT}, "prepare": prepare or []},
        "evaluator": {"type": "session_completed"},
        # the task's sampling governs (the gateway's default policy): keep calls short
        "sampling": {"max_tokens": 16},
        "phases": {"open_s": 20, "provision_s": 60, "run_s": 240},
        "timeout_s": 400,
    }
    task.update(overrides)
    return task


def supervised_stack(home: Path, host_id: str) -> LocalStack:
    """``rolloutd up``'s stack on ``home`` (not started): free ports, the supervisor on with a
    0.5 s first backoff, an engine of 4 slots and 8,192 tokens, plain-text logs, and this
    repository on the children's ``PYTHONPATH`` (their evaluators and harness helpers)."""
    return LocalStack(
        home=home,
        temporal_port=free_port(),
        ui_port=free_port(),
        gateway_port=free_port(),
        engine_port=free_port(),
        engine_parallel=4,
        engine_ctx_size=8192,
        restart_policy=RestartPolicy(initial_backoff_s=0.5),
        extra_env={
            "ROLLOUTD_LOG_JSON": "false",
            "ROLLOUTD_HOST_ID": host_id,
            "PYTHONPATH": os.pathsep.join(
                [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        },
    )


def new_ids(prefix: str) -> tuple[str, str]:
    """A fresh task id and process marker."""
    tag = uuid.uuid4().hex[:8]
    return f"{prefix}-{tag}", f"rolloutd-rel-{tag}"


async def poll(predicate, timeout_s: float, what: str, every_s: float = 0.25) -> Any:
    """Await ``predicate()`` (sync or async) until truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(every_s)


@dataclass
class Rig:
    """The running stack and what the tests read from it."""

    stack: LocalStack
    engine_tee: Any
    runtime_root: Path

    def engine_answers(self) -> int:
        """Completed generation requests llama-server answered (200) so far; the calls that
        score a left-out logprob again (one forced token, ``logit_bias``:
        ``proxy/backends/llama_cpp_logprobs.py``) sample nothing and are not counted."""
        return sum(
            1
            for ex in self.engine_tee.exchanges
            if ex.method == "POST"
            and ex.status == 200
            and ex.path.rstrip("/").endswith(("completion", "completions"))
            and not _scores_again(ex.request_body)
        )


def _scores_again(request_body: bytes) -> bool:
    """Whether a llama.cpp ``/completion`` request scores a left-out logprob again (one
    forced token through ``logit_bias``) instead of sampling an answer."""
    try:
        body = json.loads(request_body)
    except ValueError:
        return False
    return isinstance(body, dict) and "logit_bias" in body and body.get("n_predict") == 1


@pytest.fixture(scope="session")
async def rig(tmp_path_factory) -> AsyncIterator[Rig]:
    """LocalStack (own Temporal with SQLite, own llama-server behind a Tee, four fleets).
    8K tokens per slot: Qwen Code's compact first request is about 3.2K (test_replay.py)."""
    from rolloutd.engine.server import LlamaServer
    from tests.support.tee import Tee

    home = tmp_path_factory.mktemp("reliability")
    (home / "logs").mkdir()
    engine = await asyncio.to_thread(
        lambda: LlamaServer(
            "qwen2.5-coder-0.5b", parallel=4, ctx_size=32768, log_path=home / "logs" / "engine.log"
        ).start(timeout_s=180)
    )
    tee = await Tee(engine.url).start()
    # supervise=False: these tests restart a killed fleet by hand, and a supervisor doing it
    # too would run two workers with one host id
    stack = LocalStack(
        home=home,
        engine_url=tee.url,
        temporal_port=free_port(),
        ui_port=free_port(),
        gateway_port=free_port(),
        supervise=False,
        extra_env={
            "ROLLOUTD_LOG_JSON": "false",
            "ROLLOUTD_HOST_ID": "rel-host",
            # the eval fleet imports tests.reliability.slow_evaluator
            "PYTHONPATH": os.pathsep.join(
                [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            # test_cancel_many runs 100 harnesses on this host at
            # once, starting 16 at a time
            "ROLLOUTD_MAX_CONCURRENT_SESSIONS": "128",
            "ROLLOUTD_MAX_CONCURRENT_PROVISIONS": "16",
        },
    )
    try:
        await asyncio.to_thread(stack.start)
        yield Rig(stack=stack, engine_tee=tee, runtime_root=home / "runtimes")
    finally:
        await asyncio.to_thread(stack.stop)
        await tee.stop()
        await asyncio.to_thread(engine.stop)


def harness_ids(store, session_id: str) -> list[str] | None:
    """The answer ids the harness of ``session_id`` printed (None: it printed none)."""
    from rolloutd.store import artifact_key

    harness = store.get_json(artifact_key(session_id, "harness"))
    for line in str(harness.get("stdout") or "").splitlines():
        if line.startswith("IDS "):
            return json.loads(line[4:])
    return None
