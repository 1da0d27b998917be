"""The Harbor verifier's tamper rules (rolloutd.sandbox.tamper; the runner rules it shares with
SWE-bench are tested in tests/security/test_tamper.py) on names and on real host folders: what
a session changed that a verifier must not trust, and what it may change. No container: the
folders stand for the task image's workdir and the agent's final workspace."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rolloutd.records import TamperFinding
from rolloutd.sandbox import tamper
from rolloutd.security.tamper import MAX_FINDINGS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("path", "category"),
    [
        ("/usr/local/bin/python3", "executable"),
        ("/usr/bin/cat", "executable"),
        ("/bin/bash", "executable"),
        ("/etc/alternatives/python", "executable"),
        ("/usr/lib/git-core/git-status", "executable"),
        ("/opt/tools/bin/tar", "executable"),  # on the image's PATH (below)
        ("/etc/ld.so.preload", "library"),
        ("/etc/ld.so.conf.d/evil.conf", "library"),
        ("/usr/lib/x86_64-linux-gnu/libc.so.6", "library"),
        ("/opt/evil.so", "library"),
        ("/usr/lib/python3/dist-packages/sitecustomize.py", "interpreter_path"),
        ("/usr/lib/python3/dist-packages/evil.pth", "interpreter_path"),
        ("/usr/local/lib/python3.11/dist-packages/pytest/__init__.py", "library"),
        ("/root/.local/lib/python3.11/site-packages/x.py", "interpreter_path"),
        ("/usr/share/perl5/Carp.pm", "interpreter_path"),
        ("/app/conftest.py", "runner_config"),
        ("/app/pytest.ini", "runner_config"),
        ("/etc/profile.d/x.sh", "shell_profile"),
        ("/root/.bashrc", "shell_profile"),
        ("/etc/bash.bashrc", "shell_profile"),
        ("/etc/gitconfig", "git_config"),
        ("/root/.gitconfig", "git_config"),
        ("/srv/repo/.git/hooks/pre-commit", "git_config"),
        ("/usr/share/git-core/templates/hooks/post-checkout", "git_config"),
        ("/tests/test.sh", "verifier_path"),
        ("/logs/verifier/reward.txt", "verifier_path"),
        ("/tmp/files", None),
        ("/root/.cache/pip/x", None),
        ("/var/lib/dpkg/status", None),
        ("/logs/agent/oracle.txt", None),
        ("/solution/solve.sh", None),
        ("/etc/nginx/nginx.conf", None),
    ],
)
def test_system_paths_by_name(path, category):
    found = tamper.classify_system_path(
        path, path_dirs=("/run/rolloutd-host/bin", "/opt/tools/bin")
    )
    assert (found[0] if found else None) == category, (path, found)


def test_folders_above_a_change_are_not_leaves():
    paths = ["/usr", "/usr/local", "/usr/local/bin", "/usr/local/bin/python3", "/tmp/x", "/tmp"]
    assert tamper.leaves(paths) == ["/tmp/x", "/usr/local/bin/python3"]
    from rolloutd.sandbox.snapshot import Changes

    diff = Changes(
        added=["/usr/local/bin/python3"],
        modified=["/usr", "/usr/local", "/usr/local/bin", "/usr/lib/python3.11"],
        deleted=["/usr/lib/python3.11/sitecustomize.py"],
    )
    assert diff.leaves() == {"/usr/local/bin/python3", "/usr/lib/python3.11/sitecustomize.py"}
    assert tamper.is_bytecode_cache("/usr/lib/python3.11/__pycache__/os.cpython-311.pyc")
    assert not tamper.is_bytecode_cache("/usr/lib/python3.11/os.pyc")


def test_git_keys_that_run_a_program():
    config = b"""[core]
\trepositoryformatversion = 0
\tfsmonitor = false
[user]
\tname = agent
[alias]
\tst = status
\tx = !sh -c 'echo 1 > /logs/verifier/reward.txt'
[core] fsMonitor = .git/hooks/watch
[filter "lfs"]
\tclean = evil %f
[includeIf "gitdir:/"]
\tpath = /tmp/more
"""
    keys = dict(tamper.git_program_keys(config))
    assert keys == {
        "alias.x": "!sh -c 'echo 1 > /logs/verifier/reward.txt'",
        "core.fsmonitor": ".git/hooks/watch",
        "filter.*.clean": "evil %f",
        "includeif.*.path": "/tmp/more",
    }
    assert tamper.git_program_keys(b"[core]\n\tbare = false\n[user]\n\temail = a@b\n") == set()


def _tree(root: Path, files: dict[str, str | None]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            path.mkdir(exist_ok=True)
        else:
            path.write_text(text)
    return root


def _agent_copy(shipped: Path, final: Path) -> Path:
    shutil.copytree(shipped, final, symlinks=True)  # copy2: times kept, as a seeded workspace
    return final


SHIPPED = {
    "textstats/__init__.py": "from .counts import *\n",
    "textstats/counts.py": "def word_count(t):\n    return len(t.split(' '))\n",
    "tests/test_counts.py": "def test_x():\n    pass\n",
    "pyproject.toml": "[project]\nname = 'textstats'\n",
    "tests/conftest.py": "import pytest\n",
    ".git/config": "[core]\n\tbare = false\n",
    ".git/hooks/pre-commit.sample": "#!/bin/sh\n",
}


def test_an_honest_answer_and_runner_files_in_the_workdir(tmp_path):
    """Fixing the code, adding a module, editing the project's metadata, a pytest cache, a
    git commit's objects: no finding. Every runner-configuring file the task did not ship (or
    shipped otherwise), a git hook and a git setting that runs a program: one finding each,
    named by its path inside."""
    shipped = _tree(tmp_path / "shipped", SHIPPED)
    final = _agent_copy(shipped, tmp_path / "final")
    (final / "textstats/counts.py").write_text("def word_count(t):\n    return len(t.split())\n")
    (final / "textstats/extra.py").write_text("X = 1\n")
    (final / "pyproject.toml").write_text("[project]\nname = 'textstats'\nversion = '2'\n")
    _tree(final, {".pytest_cache/v/cache/nodeids": "[]", ".git/objects/ab/cdef": "x"})
    _tree(final, {"textstats/__pycache__/conftest.cpython-311-pytest-7.2.1.pyc": "x"})
    (final / ".git/hooks/pre-commit.sample").write_text("#!/bin/sh\nexit 0\n")
    honest = tamper.examine_workdir(shipped, final, workdir="/app")
    assert honest.findings == []
    assert honest.num_changed >= 5

    _tree(
        final,
        {
            "conftest.py": "def pytest_runtest_makereport(): ...\n",
            "pytest.py": "import sys; sys.exit(0)\n",
            "unittest/__init__.py": "",
            "sitecustomize.py": "",
            "x.pth": "import os\n",
            "setup.cfg": "[tool:pytest]\naddopts = -p evil\n",
            "tests/conftest.py": "import pytest\nimport evil\n",  # shipped, changed
            ".git/hooks/post-checkout": "#!/bin/sh\n",
            "build/lib/evil.dist-info/entry_points.txt": "[pytest11]\nevil = evil\n",
        },
    )
    with open(final / ".git/config", "a") as f:
        f.write("[core]\n\tfsmonitor = .git/hooks/watch\n")
    (final / "pyproject.toml").write_text(
        "[project]\nname = 'textstats'\n[tool.pytest.ini_options]\naddopts = '-p evil'\n"
    )
    found = {f.path: f for f in tamper.examine_workdir(shipped, final, workdir="/app").findings}
    assert sorted(found) == [
        "/app/.git/config",
        "/app/.git/hooks/post-checkout",
        "/app/build/lib/evil.dist-info/entry_points.txt",
        "/app/conftest.py",
        "/app/pyproject.toml",
        "/app/pytest.py",
        "/app/setup.cfg",
        "/app/sitecustomize.py",
        "/app/tests/conftest.py",
        "/app/unittest/__init__.py",
        "/app/x.pth",
    ]
    assert found["/app/tests/conftest.py"].change == "modified"
    assert found["/app/conftest.py"].change == "added"
    assert found["/app/.git/config"].category == "git_config"
    assert "core.fsmonitor = .git/hooks/watch" in found["/app/.git/config"].detail
    assert found["/app/pytest.py"].category == "library"  # a module named like the runner
    assert found["/app/x.pth"].category == "interpreter_path"


def test_links_path_folders_and_a_git_file(tmp_path):
    """A conftest.py that is a link (never followed), a program in a workdir folder on the
    verifier's PATH, a standard-library name at the top of a PYTHONPATH folder in the
    workdir, and a .git file pointing elsewhere are findings; a program in a folder not on
    PATH (the task's answer, /app/colstats) is not."""
    shipped = _tree(tmp_path / "shipped", {"bin/tool": "#!/bin/sh\n", "lib/mod.py": ""})
    final = _agent_copy(shipped, tmp_path / "final")
    os.symlink("/etc/passwd", final / "conftest.py")
    (final / "bin/python3").write_text("#!/bin/sh\nexit 0\n")
    (final / "lib/json.py").write_text("")
    (final / "colstats").write_text("#!/usr/bin/env python3\n")
    (final / ".git").write_text("gitdir: /tmp/elsewhere\n")
    found = tamper.examine_workdir(
        shipped,
        final,
        workdir="/app",
        path_dirs=("/run/rolloutd-host/bin", "/app/bin", "/usr/bin"),
        python_path_dirs=("/app/lib",),
    ).findings
    assert {(f.path, f.category) for f in found} == {
        ("/app/conftest.py", "runner_config"),
        ("/app/bin/python3", "executable"),
        ("/app/lib/json.py", "interpreter_path"),
        ("/app/.git", "git_config"),
    }


def test_the_examples_own_workdirs_hold_no_finding(tmp_path):
    """Each Harbor example's shipped environment/ folder against itself plus its oracle's
    kind of change (a new file): no finding."""
    for task in sorted((ROOT / "examples" / "harbor").iterdir()):
        shipped = tmp_path / task.name / "shipped"
        shutil.copytree(task / "environment", shipped)
        final = _agent_copy(shipped, tmp_path / task.name / "final")
        (final / "answer.txt").write_text("x\n")
        assert tamper.examine_workdir(shipped, final, workdir="/app").findings == [], task.name


def test_report_lists_are_bounded():
    many = [TamperFinding(path=f"/usr/bin/x{n}", category="executable") for n in range(60)]
    report = tamper.report(many, many[:3], num_changed_paths=70, carried_system_changes=True)
    assert len(report.findings) == MAX_FINDINGS and report.truncated and report.tampered
    assert tamper.report([], many[:2], num_changed_paths=2, carried_system_changes=False).ignored


def _pack(path: Path, members: list[tuple[str, str, int, str]]) -> Path:
    """A tar of (name, type, mode, link target) entries, as tar(1) writes absolute paths."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, kind, mode, target in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE}.get(kind, kind.encode())
            info.linkname = target
            data = b"x" if kind == "file" else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return path


def test_a_pack_is_checked_against_the_diff(tmp_path):
    """An executable file and a link on the verifier's path are findings; an entry the diff
    does not list, or a hard link out of the pack, fails the check."""
    from rolloutd.errors import RolloutdError
    from rolloutd.sandbox.snapshot import check_pack

    written = ["/etc/app.conf", "/logs", "/opt/tool", "/opt/tool/run", "/opt/tool/again"]
    pack = _pack(
        tmp_path / "a.tar",
        [
            ("etc/app.conf", "file", 0o644, ""),
            ("logs", "2", 0o777, "/tmp/fake"),  # a symbolic link
            ("opt/tool/", "dir", 0o755, ""),
            ("opt/tool/run", "file", 0o755, ""),
            ("opt/tool/again", "1", 0o644, "etc/app.conf"),  # a hard link to an entry
        ],
    )
    found = {(f.path, f.category) for f in check_pack(pack, written)}
    assert found == {("/logs", "verifier_path"), ("/opt/tool/run", "executable")}
    with pytest.raises(RolloutdError, match="unexpectedly"):
        check_pack(_pack(tmp_path / "b.tar", [("usr/bin/python3", "file", 0o755, "")]), written)
    outside = [("opt/tool/again", "1", 0o644, "usr/bin/python3")]
    with pytest.raises(RolloutdError, match="outside it"):
        check_pack(_pack(tmp_path / "c.tar", outside), written)
