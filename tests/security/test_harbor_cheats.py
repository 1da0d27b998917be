"""Adversarial sessions against the ``harbor`` verifier, through the whole stack on podman:
real Temporal, the four fleets, real llama-server (Qwen2.5-Coder-0.5B) behind the gateway. Each
cheat is a ``shell`` harness that first makes one model call through the session's gateway
(Python's urllib on the session's base URL), then cheats, then proves the cheat is live in its
own container (the faked program answers, pytest "passes", the hook runs: else the harness
exits non-zero and the test fails). Each must earn 0.00 with its cause in the evaluation
record: a tamper finding named (the verifier does not run), or the changes the verifier did
not carry named beside the reward test.sh wrote on the task's own image.

Controls: the oracle earns 1.00 on every example (with and without ``carry_system_changes``),
a harness that makes its call and does nothing 0.00, an honest wrong answer 0.00.

Needs gcc on the host (the ld.so.preload cheat's library is compiled here).
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from dataclasses import dataclass

import pytest

from rolloutd.tasksets import read_task_set
from rolloutd.types import SessionResult, TaskRequest
from tests.support.harbor_cheats import fake_on_path, shell
from tests.support.taskset_stack import Rig, report, run_all

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman"),
]

#: the site-packages folder of the image's Python (where site(7) reads .pth files)
SITE = "SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])') && mkdir -p $SITE"
#: makes a C library that ends every python3 with exit status 0 (when preloaded)
PRELOAD_C = r"""
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void cheat(void) {
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return;
    exe[n] = 0;
    const char *base = strrchr(exe, '/');
    if (strncmp(base ? base + 1 : exe, "python3", 7) == 0) _exit(0);
}
"""
#: proves a python3 cheat live: a script that exits 3 exits 0
PYTHON_LIVE = "python3 -c 'raise SystemExit(3)'"


@dataclass
class Cheat:
    """One adversarial session: its task, what it does after its model call, and the cause
    its evaluation record must name (a finding's path, or a path not carried)."""

    task: str
    command: str
    finding: str | None = None
    not_carried: str | None = None


def cheats(preload_b64: str) -> dict[str, Cheat]:
    """The cheats of the suite, by name."""
    return {
        "reward-file-and-tests": Cheat(
            "fix-word-count",
            "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && "
            "echo '{\"reward\": 1}' > /logs/verifier/reward.json && mkdir -p /tests && "
            "printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && "
            "chmod +x /tests/test.sh && "
            "for f in tests/*.py; do printf 'def test_ok():\\n    assert True\\n' > $f; done",
            not_carried="/logs/verifier/reward.txt",
        ),
        **{
            f"fake-{name}": Cheat(
                "fix-word-count", fake_on_path(name), not_carried=f"/usr/local/bin/{name}"
            )
            for name in ("python3", "bash", "cat", "sh", "tar")
        },
        "pytest-py-in-workdir": Cheat(
            "fix-word-count",
            "printf 'import sys\\nsys.exit(0)\\n' > pytest.py\n"
            "python3 -m pytest -q -p no:cacheprovider /tests/none.py",
            finding="/app/textstats/pytest.py",
        ),
        "sitecustomize-in-site-packages": Cheat(
            "fix-word-count",
            # Debian's own sitecustomize (a link in the standard library's folder) comes
            # first on sys.path: it goes, so that site-packages' is the one imported
            f"{SITE}\nrm -f /usr/lib/python3*/sitecustomize.py\n"
            f"printf 'import os\\nos._exit(0)\\n' > $SITE/sitecustomize.py\n{PYTHON_LIVE}",
            not_carried="dist-packages/sitecustomize.py",
        ),
        "pth-in-site-packages": Cheat(
            "fix-word-count",
            f"{SITE}\nprintf 'import os; os._exit(0)\\n' > $SITE/zz-cheat.pth\n{PYTHON_LIVE}",
            not_carried="zz-cheat.pth",
        ),
        "ld-so-preload": Cheat(
            "fix-word-count",
            f"base64 -d > /usr/local/lib/cheat.so <<'B64'\n{preload_b64}\nB64\n"
            "echo /usr/local/lib/cheat.so > /etc/ld.so.preload\n" + PYTHON_LIVE,
            not_carried="/etc/ld.so.preload",
        ),
        "git-fsmonitor-hook": Cheat(
            "git-restore-file",
            "/bin/cat > .git/hooks/fsmonitor-cheat <<'HOOK'\n#!/bin/sh\n"
            "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; pkill -9 -x bash\n"
            "exit 0\nHOOK\nchmod +x .git/hooks/fsmonitor-cheat\n"
            'git config core.fsmonitor "$PWD/.git/hooks/fsmonitor-cheat"\n'
            "git status --porcelain > /dev/null 2>&1 || true\n"
            "test -f /logs/verifier/reward.txt\nrm -rf /logs",
            finding="/app/service/.git/config",
        ),
    }


@pytest.fixture(scope="module")
def preload_b64(tmp_path_factory) -> str:
    """The ld.so.preload cheat's library, compiled with the host's gcc, as base64."""
    folder = tmp_path_factory.mktemp("preload")
    (folder / "cheat.c").write_text(PRELOAD_C)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-o", "cheat.so", "cheat.c"], cwd=folder, check=True
    )
    return base64.encodebytes((folder / "cheat.so").read_bytes()).decode()


def one_task(rig: Rig, name: str, harness: dict, prefix: str, **options) -> TaskRequest:
    (task,) = read_task_set(
        "harbor",
        rig.tasks / "harbor" / name,
        {"harness": harness, "task_id_prefix": prefix, "max_replacements": 0, **options},
    )
    return task


def only_session(results, task_id: str) -> SessionResult:
    (session,) = next(g.sessions for t, g, _ in results if t.task_id == task_id)
    return session


async def test_every_cheat_earns_0_with_its_cause_named(rig, preload_b64):
    """Eleven cheats, each after one answered model call, each live in its own container:
    the reward file and /tests; a fake python3, bash, cat, sh and tar first on PATH; a
    pytest.py shadowing pytest in the workdir of fix-word-count; a sitecustomize.py and a .pth
    in site-packages; /etc/ld.so.preload; a git core.fsmonitor hook in git-restore-file. Each
    earns 0.00 from verifier revision 2, its cause in the evaluation record. Measured
    (2026-12-06, eleven sessions at once, load average 4-8 on 2 cores): 35-61 s, 7-37 s a
    session, most of it the engine's answer."""
    tasks = {
        name: one_task(rig, cheat.task, shell(cheat.command), f"cheat-{name}-")
        for name, cheat in cheats(preload_b64).items()
    }
    results = await run_all(rig, list(tasks.values()))
    report("cheat", results)
    for name, cheat in cheats(preload_b64).items():
        session = only_session(results, tasks[name].task_id)
        record = session.evaluation
        assert session.num_completions >= 1 and session.num_unrecovered_call_errors == 0, name
        assert session.harness_exit_code == 0, (name, "the cheat was not live")
        assert session.failure is None and session.reward == 0.0, (name, session.reward)
        assert record is not None and record.version.endswith("+r2"), name
        assert record.tamper is not None, name
        if cheat.finding:
            assert cheat.finding in {f.path for f in record.tamper.findings}, (name, record)
            assert record.reason and record.reason.startswith("tampered:"), (name, record)
            assert cheat.finding in record.reason, (name, record.reason)
        else:
            assert not record.tamper.tampered, (name, record.tamper)
            ignored = [f.path for f in record.tamper.ignored]
            assert any(p.endswith(cheat.not_carried) for p in ignored), (name, ignored)
            assert record.reason and record.reason.startswith("test.sh wrote reward 0"), name
            assert "not carried to the verifier" in record.reason, (name, record.reason)


async def test_controls_oracle_nothing_and_a_wrong_answer(rig):
    """The oracle: 1.00 on each of the six examples, by default and with
    carry_system_changes; a harness that makes its model call and does nothing: 0.00 on each;
    an honest wrong answer to fix-word-count (one of its two bugs fixed): 0.00; and with
    carry_system_changes a fake python3 is a finding: 0.00, named. Measured (2026-12-06, 21
    sessions at once, load average 4-8): 40-61 s with the images built."""
    names = sorted(p.name for p in (rig.tasks / "harbor").iterdir() if p.is_dir())
    oracle, nothing = {"type": "oracle"}, shell("true")
    tasks = [
        *(one_task(rig, n, oracle, "oracle-") for n in names),
        *(one_task(rig, n, oracle, "carry-", carry_system_changes=True) for n in names),
        *(one_task(rig, n, nothing, "nothing-") for n in names),
        one_task(
            rig,
            "fix-word-count",
            shell("sed -i 's/text.split(\" \")/text.split()/' textstats/counts.py"),
            "wrong-",
        ),
        one_task(
            rig,
            "fix-word-count",
            shell(fake_on_path("python3")),
            "carry-fake-",
            carry_system_changes=True,
        ),
    ]
    results = await run_all(rig, tasks)
    report("control", results)
    for task, group, _ in results:
        (session,) = group.sessions
        assert session.failure is None, (task.task_id, session.error)
        prefix = task.task_id.split("-")[0]
        want = 1.0 if prefix in ("oracle", "carry") and "fake" not in task.task_id else 0.0
        assert session.reward == want, (task.task_id, session.evaluation)
        assert session.evaluation is not None and session.evaluation.tamper is not None
        if prefix == "carry":
            assert session.evaluation.tamper.carried_system_changes
        if prefix in ("nothing", "wrong"):
            assert session.num_completions >= 1
            assert session.evaluation.reason.startswith("test.sh wrote reward 0"), task.task_id
    fake = only_session(results, tasks[-1].task_id)
    assert "/usr/local/bin/python3 (executable, added)" in (fake.evaluation.reason or "")
