"""llama-server SIGKILLed mid-batch under ``rolloutd up``'s supervisor, the batch run as a user
runs it (``rolloutd submit`` on a JSONL file), with a harness that never retries a failed call.

The harness holds one conversation of several turns; a call that fails gets a placeholder
answer and the conversation goes on (as Qwen Code does), and it exits 0 whatever happened. The
supervisor restarts the engine on its own (nothing here starts it), so later turns are answered
again: such a conversation does not make good its failed call. Checked: no session whose call
failed unrecovered has a reward (each ends ``backend``); each replacement replays its replaced
session's conversation up to the failed call (the completions before it, from the log, without
an engine call); ``rolloutd submit`` exits 0 exactly when every sample ended with a reward,
else 1, and prints what went wrong.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from rolloutd.proxy.sessions.state import SessionState, session_state_key
from rolloutd.stack import read_state
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import TaskResult
from tests.reliability.conftest import STACK_MARKS, poll, supervised_stack

pytestmark = [*STACK_MARKS, pytest.mark.timeout(1200)]

NUM_TASKS = NUM_SAMPLES = 4
NUM_TURNS = 5

#: one conversation of NUM_TURNS turns; a failed call gets a placeholder answer and is never
#: retried; exit 0 whatever happened
CONVERSATION = f"""python3 - <<'PY'
import json, os, time, urllib.request
messages = []
for n in range({NUM_TURNS}):
    messages.append({{"role": "user", "content": f"count to {{n}}"}})
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({{"model": "m", "messages": messages}}).encode(),
        headers={{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"}},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            content = json.load(answer)["choices"][0]["message"]["content"]
    except Exception as error:
        content = f"(no answer: {{error}})"
        time.sleep(3)  # then goes on: the engine may be back for the next turn
    messages.append({{"role": "assistant", "content": content}})
    time.sleep(1)
PY"""


def task(task_id: str, max_replacements: int) -> dict:
    """One task of the batch: NUM_SAMPLES sessions of the conversation, scored 1.0 when the
    harness exits 0 (it always does: only the failure rules keep a broken one unrewarded)."""
    return {
        "task_id": task_id,
        "max_replacements": max_replacements,
        "num_samples": NUM_SAMPLES,
        "instruction": "count",
        "runtime": {"type": "local"},
        "harness": {"type": "shell", "command": CONVERSATION},
        "sampling": {"max_tokens": 8, "temperature": 0.0, "policy": "override"},
        "evaluator": {"type": "session_completed"},
        "phases": {"run_s": 600, "provision_wait_s": 240},
        "timeout_s": 1100,
    }


def first_failed_call(store: BlobStore, session_id: str) -> int | None:
    """Index in the session's log where its first failed call fell (the completions before
    it are what a replacement replays), or None when no call of it failed."""
    state = store.get_model(session_state_key(session_id), SessionState)
    return min((e.at_index for e in state.errors), default=None)


@pytest.mark.acceptance
@pytest.mark.parametrize("max_replacements", [NUM_SAMPLES, 0], ids=["replaced", "not-replaced"])
async def test_an_engine_killed_under_up_never_rewards_a_broken_session(
    tmp_path: Path, max_replacements: int
):
    """Kill llama-server mid-batch under ``rolloutd up``; ``rolloutd submit`` waits the batch
    out. With a replacement for each sample, every sample ends with a reward and ``submit``
    exits 0; with none, the broken samples end without one and it exits 1 naming them.
    Acceptance tier (a long kill): about 60 s each here."""
    # short, not under pytest's basetemp: runtimes hold AF_UNIX sockets (108 bytes)
    home = Path(tempfile.mkdtemp(prefix="rolloutd-kup-"))
    marker = uuid.uuid4().hex[:6]
    stack = supervised_stack(home, f"kup-{marker}")
    task_ids = [f"kill-up-{n}-{marker}" for n in range(NUM_TASKS)]
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(task(t, max_replacements)) + "\n" for t in task_ids))
    try:
        await asyncio.to_thread(stack.start)
        assert stack.temporal is not None and stack.store_url is not None
        store = BlobStore(stack.store_url)
        submit = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rolloutd.cli",
            "submit",
            str(tasks_file),
            "--address",
            stack.temporal.address,
            "--store-url",
            stack.store_url,
            "--gateway-url",
            stack.gateway_url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "ROLLOUTD_HOME": str(home)},
        )

        def recorded() -> int:
            return len(list(Path(stack.store_url).glob("sessions/**/completions/*.json")))

        await poll(lambda: recorded() >= 6, 300, "the batch under way")
        engine = next(c for c in read_state(home).children if c.name == "engine")  # type: ignore[union-attr]
        assert engine.phase == "running" and engine.pid is not None
        os.kill(engine.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        back = await poll(
            lambda: (
                (c := next(c for c in read_state(home).children if c.name == "engine")).phase
                == "running"
                and c.pid not in (None, engine.pid)
                and c
            ),
            120,
            "the engine restarted by the supervisor",
        )
        restart_s = time.monotonic() - killed_at
        out, err = await asyncio.wait_for(submit.communicate(), timeout=900)
        client = await RolloutClient.connect(stack.temporal.address, store_url=stack.store_url)
        results: list[TaskResult] = [await client.result(t) for t in task_ids]
    finally:
        await asyncio.to_thread(stack.stop)
    report = out.decode() + err.decode()
    print(f"\nengine back after {restart_s:.1f} s (restarts {back.restarts})")
    print(f"$ rolloutd submit (exit {submit.returncode})\n{out.decode()}\n{err.decode()[-1500:]}")

    replaced = [s for group in results for s in group.replaced]
    broken = [*replaced, *(s for g in results for s in g.sessions if s.failure is not None)]
    assert broken, "the kill hit no session"
    for s in broken:  # a broken session never becomes a reward
        assert s.reward is None and s.failure is not None, s
        assert s.failure.kind == "backend", s.failure
    # the case the rule is about: a conversation that went on past its failed call and was
    # answered again after the restart
    went_on = [
        s
        for s in broken
        if (k := first_failed_call(store, s.session_id)) is not None and k < s.num_completions
    ]
    print(f"{len(broken)} broken, {len(replaced)} replaced, {len(went_on)} went on past a failure")
    assert went_on, broken
    for group in results:
        for s in group.sessions:  # a reward only for a session whose every call was answered
            if s.reward is not None:
                assert s.failure is None and s.num_unrecovered_call_errors == 0, s
        for s in group.replaced:  # its replacement replays up to the failed call
            k = first_failed_call(store, s.session_id)
            successors = [
                r for r in [*group.sessions, *group.replaced] if s.session_id in r.replay.sources
            ]
            assert successors, f"nothing replaced {s.session_id}"
            for r in successors:
                assert r.replay.num_replayed >= min(k or 0, 1), (s, r.replay)
                assert r.replay.num_replayed <= (k or 0), (s, r.replay)
            if k:
                assert max(r.replay.num_replayed for r in successors) == k, (s, successors)
    whole = all(s.reward is not None for group in results for s in group.sessions)
    print(f"submit exit {submit.returncode}; every sample rewarded: {whole}")
    assert whole == bool(max_replacements), report
    assert submit.returncode == (0 if whole else 1), report
    if not whole:  # what went wrong, by session
        for s in broken:
            assert f"FAILED: session {s.session_id}: backend in run" in report, report
    assert "unavailable" not in report, report
    shutil.rmtree(home, ignore_errors=True)  # kept when the test fails, to read
