"""Harbor tasks and SWE-bench instances through the whole stack on podman: real Temporal, the
four fleets (in a namespace of their own, with the operator's policy these tasks need: podman,
the copied task folders as image roots and upload sources, network for image builds), real
llama-server (Qwen2.5-Coder-0.5B) behind the gateway, the trainer client or the buffer.

Figures printed for the note: reward and wall time per task and harness.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rolloutd.sandbox.config import npm_prefix
from rolloutd.store import CompletionLog
from rolloutd.tasksets import read_task_set
from rolloutd.trajectory import check_invariants
from tests.support.taskset_stack import Rig, report, rewards_of, run_all, taskset_rig

ROOT = Path(__file__).resolve().parents[2]
NOP = {"type": "shell", "command": "true"}

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman"),
]


@pytest.fixture(scope="module")
def task_root(tmp_path_factory) -> Path:
    """examples/harbor and examples/swebench (with its build contexts made from the sdists:
    make_instances.py --contexts) copied below one folder the policy names."""
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "swebench" / "make_instances.py"), "--contexts"],
        check=True,
    )
    root = tmp_path_factory.mktemp("sets")
    shutil.copytree(ROOT / "examples" / "harbor", root / "harbor")
    shutil.copytree(ROOT / "examples" / "swebench", root / "swebench")
    return root


@pytest.fixture(scope="module")
async def rig(temporal_server, engine, task_root) -> AsyncIterator[Rig]:
    """The four fleets in a fresh namespace, on the real engine."""
    async with taskset_rig(temporal_server.address, engine.url, task_root, "tasksets") as rig:
        yield rig


async def test_oracle_and_nop_on_every_example_task_and_instance(rig):
    """Oracle: reward 1.00 on each of the 6 Harbor tasks and 3 SWE-bench instances; a harness
    that does nothing: 0.00 on each. 18 tasks through Temporal and podman, 8 at a time.
    Measured: 3.5 min cold (the SWE-bench images built, the engine started), 1.5 min warm."""
    oracle, nop = {"harness": {"type": "oracle"}}, {"harness": NOP}
    tasks = [
        *read_task_set("harbor", rig.tasks / "harbor", oracle),
        *read_task_set("swebench", rig.tasks / "swebench" / "instances.jsonl", oracle),
    ]
    nops = [
        *read_task_set("harbor", rig.tasks / "harbor", nop | {"task_id_prefix": "nop-"}),
        *read_task_set(
            "swebench", rig.tasks / "swebench" / "instances.jsonl", nop | {"task_id_prefix": "nop-"}
        ),
    ]
    results = await run_all(rig, tasks + nops)
    report("stack", results)
    got = rewards_of(results)
    assert len(got) == 18
    for task_id, rewards in got.items():
        assert rewards == ([0.0] if task_id.startswith("nop-") else [1.0]), (task_id, rewards)


async def test_adversarial_agent_earns_0_through_the_stack(rig):
    """On every Harbor task, an agent that writes /logs/verifier/reward.txt = 1 (and a
    reward.json), plants its own /tests/test.sh, rewrites the tests it can see and deletes
    /tests: reward 0.00 each. Measured: 8-11 s a task, all six at once."""
    from tests.tasksets.test_harbor_podman import ADVERSARY

    options = {"harness": {"type": "shell", "command": ADVERSARY}, "task_id_prefix": "adv-"}
    results = await run_all(rig, read_task_set("harbor", rig.tasks / "harbor", options))
    report("adversary", results)
    assert all(rewards == [0.0] for rewards in rewards_of(results).values())


#: a pytest hook that reports every test phase as passed
PASS_EVERYTHING = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n"
    "    report = outcome.get_result()\n"
    "    report.outcome, report.longrepr = 'passed', None\n"
)


#: one chat call to the session's gateway with the image's python3 (its images have no curl)
ASK = (
    "import json, os, urllib.request\n"
    "body = {'model': 'm', 'max_tokens': 8,\n"
    "        'messages': [{'role': 'user', 'content': 'Fix partition(None, ...).'}]}\n"
    "request = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions',\n"
    "    data=json.dumps(body).encode(), headers={'Content-Type': 'application/json',\n"
    "    'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n"
    "urllib.request.urlopen(request, timeout=600).read()\n"
)


def model_call_then(command: str) -> dict:
    """A shell harness that makes one chat call through the session's gateway (nothing of it
    kept in the repository), then runs ``command`` in the repository."""
    ask = base64.b64encode(ASK.encode()).decode()
    return {"type": "shell", "command": f"echo {ask} | base64 -d | python3 - && {command}"}


def write_files(files: dict[str, str]) -> str:
    """Shell commands writing ``files`` (path -> text), base64 so no quoting gets in the way."""
    return " && ".join(
        f"echo {base64.b64encode(text.encode()).decode()} | base64 -d > {path}"
        for path, text in files.items()
    )


async def test_swebench_patch_that_steers_its_grading_earns_0(rig):
    """more-itertools on podman: after one model call each, a harness that adds a root
    ``conftest.py`` setting every test report to passed, and one that adds a ``pytest.ini``
    loading such a hook from a module it adds, earn 0.00 with the file named in the evaluation
    record (tamper); the gold patch after a model call earns 1.00 and a model call alone 0.00.
    Measured (2026-12-06, load average 3.5-4.8 on 2 cores, the image built by an earlier run):
    121 s for the four at once, 76-108 s a session."""
    instances = rig.tasks / "swebench" / "instances.jsonl"
    row = next(
        json.loads(line) for line in instances.read_text().splitlines() if "more-itertools" in line
    )
    gold = base64.b64encode(row["patch"].encode()).decode()
    harnesses = {
        "conftest": (write_files({"conftest.py": PASS_EVERYTHING}), "conftest.py"),
        "pytest-ini": (
            write_files(
                {
                    "pytest.ini": "[pytest]\naddopts = -p more_itertools.checks\n",
                    "more_itertools/checks.py": PASS_EVERYTHING,
                }
            ),
            "pytest.ini",
        ),
        "gold": (f"echo {gold} | base64 -d | git apply -", None),
        "nop": ("true", None),
    }
    tasks = []
    for name, (command, _) in harnesses.items():
        options = {"harness": model_call_then(command), "task_id_prefix": f"{name}-"}
        (task,) = [t for t in read_task_set("swebench", instances, options) if "more" in t.task_id]
        tasks.append(task)
    results = await run_all(rig, tasks)
    report("swebench cheats", results)
    for (name, (_, tampered)), (_, group, _) in zip(harnesses.items(), results, strict=True):
        (session,) = group.sessions
        record = session.evaluation
        print(f"{name}: reward {session.reward}, reason {record.reason if record else None}")
        assert session.num_completions == 1, name
        assert session.reward == (1.0 if name == "gold" else 0.0), (name, record)
        assert record is not None and record.tamper is not None
        assert [f.path for f in record.tamper.findings][:1] == ([tampered] if tampered else [])
        if tampered:
            assert record.reason.startswith("tampered:") and tampered in record.reason


async def test_buffer_reads_a_harbor_task_set(rig):
    """The training buffer's task source reads the Harbor folder (eval fleet) and hands out
    every task's group, scored. Measured: about 30 s with the images built."""
    buffer = await rig.client.create_buffer(
        {
            "buffer_id": f"harbor-{uuid.uuid4().hex[:6]}",
            "source": {
                "type": "harbor",
                "path": str(rig.tasks / "harbor"),
                "chunk_size": 4,
                "options": {"harness": {"type": "oracle"}},
            },
            "num_in_flight": 3,
            "drop_zero_variance": False,
        }
    )
    try:
        groups = []
        while len(groups) < 6:
            batch = await buffer.take(6 - len(groups), timeout_s=900)
            groups += batch.groups
            await buffer.ack(batch.batch_id)
    finally:
        await buffer.close()
    names = sorted(g.group.task_id for g in groups)
    print("buffer groups:", [(g.group.task_id, g.group.sessions[0].reward) for g in groups])
    assert names == sorted(p.name for p in (rig.tasks / "harbor").iterdir() if p.is_dir())
    assert all(g.group.sessions[0].reward == 1.0 for g in groups)


@pytest.mark.parametrize(
    ("harness", "package"),
    [
        ({"type": "qwen_code", "profile": "compact", "max_turns": 3}, "@qwen-code/qwen-code"),
        ({"type": "codex", "profile": "compact", "max_turns": 3}, "@openai/codex"),
    ],
)
async def test_cli_harnesses_on_the_harbor_tasks(rig, harness, package):
    """qwen_code and codex (the host's CLIs, bound into each task's container) on the six
    Harbor tasks through the gateway in tokens mode, one task at a time (six first prompts at
    once keep a CPU engine on 2 shared cores busy past the gateway's 600 s call timeout):
    every trajectory keeps the builder's invariants; rewards and wall times printed (a 0.5B
    model mostly fails these tasks: the point is the pipeline). A session that ends for the
    infrastructure (an engine too slow under load) is reported, not replaced. Measured
    (2026-11-27, load average 9-11 on 2 cores): qwen_code 23-483 s a task, codex 55-98 s a
    task; 31 min for both."""
    if not (npm_prefix() / "node_modules" / package).is_dir():
        pytest.skip(f"{package} is not installed in {npm_prefix()}: bash scripts/setup.sh")
    options = {
        "harness": harness,
        "task_id_prefix": f"{harness['type']}-",
        "max_run_s": 600,
        "max_replacements": 0,  # a figure per task, not a retried one
        "sampling": {"temperature": 0.7, "max_tokens": 256},
    }
    results = []
    for task in read_task_set("harbor", rig.tasks / "harbor", options):
        results += await run_all(rig, [task])
        report(harness["type"], results[-1:])
    num_traces = num_scored = 0
    for _task, group, _ in results:
        for session in group.sessions:
            num_scored += session.reward is not None
            completions = CompletionLog(rig.store, session.session_id).read_all()
            assert len(completions) == session.num_completions
            if completions:
                trajectory = rig.client.trajectory(session)
                check_invariants(trajectory.traces, completions)
                num_traces += len(trajectory.traces)
    print(f"{harness['type']}: {num_traces} traces checked, {num_scored} of 6 sessions scored")
    assert num_traces > 0 and num_scored > 0
