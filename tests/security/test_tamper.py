"""What of a session's changes a test verifier must not trust (rolloutd.security.tamper), read
from real ``git diff --binary`` output, and the hardened pytest runner's script and log on a
real bash, git and pytest (tests/evaluators/test_swebench.py runs both in bwrap runtimes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rolloutd.evaluators import pytest_runner
from rolloutd.evaluators.swebench import (
    SwebenchParams,
    instance_test_files,
    parse_pytest_log,
    runner_files,
)
from rolloutd.security.tamper import config_finding, patched_files, path_finding


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository with a package, tests, a setup.cfg and a file to rename."""
    for path, text in {
        "pkg/__init__.py": "",
        "pkg/core.py": "def f():\n    return 1\n",
        "tests/test_core.py": "from pkg.core import f\n\ndef test_f():\n    assert f() == 2\n",
        "setup.cfg": "[metadata]\nname = pkg\n",
        "notes.txt": "old\n",
        "old name.py": "x = 1\n",
    }.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "base")
    return tmp_path


def diff(repo: Path) -> str:
    git(repo, "add", "-A")
    return git(repo, "diff", "--binary", "--cached", "HEAD")


def test_patched_files_reads_adds_deletes_renames_quoted_and_binary_paths(repo):
    (repo / "conftest.py").write_text("y = 2\n")
    (repo / "notes.txt").unlink()
    git(repo, "mv", "old name.py", "new name.py")
    (repo / "é.pth").write_text("import os\n")
    (repo / "tests" / "__pycache__").mkdir()
    (repo / "tests" / "__pycache__" / "test_core.cpython-311.pyc").write_bytes(b"\x00\x01\xff")
    (repo / "pkg" / "core.py").write_text("def f():\n    return 2\n")
    files = {f.path: f for f in patched_files(diff(repo))}
    assert {p: f.change for p, f in files.items()} == {
        "conftest.py": "added",
        "notes.txt": "deleted",
        "old name.py": "deleted",
        "new name.py": "added",
        "é.pth": "added",
        "tests/__pycache__/test_core.cpython-311.pyc": "added",
        "pkg/core.py": "modified",
    }
    assert files["conftest.py"].text == "y = 2\n"
    assert files["new name.py"].text is None  # a rename carries no text


@pytest.mark.parametrize(
    ("path", "change", "category"),
    [
        ("conftest.py", "added", "runner_config"),
        ("src/pkg/conftest.py", "modified", "runner_config"),
        ("pytest.ini", "added", "runner_config"),
        (".pytest.ini", "deleted", "runner_config"),
        ("sitecustomize.py", "added", "interpreter_path"),
        ("lib/usercustomize.py", "added", "interpreter_path"),
        ("x.pth", "added", "interpreter_path"),
        ("pkg.egg-info/entry_points.txt", "added", "runner_config"),
        ("build/lib/pkg.dist-info/entry_points.txt", "modified", "runner_config"),
        ("pkg.egg-info/SOURCES.txt", "modified", None),  # an honest `pip install -e .`
        ("pkg.egg-info/PKG-INFO", "added", None),
        ("site/pkg.egg-link", "added", "interpreter_path"),
        ("pkg/__pycache__/core.cpython-311.pyc", "added", "library"),
        ("pytest.py", "added", "library"),
        ("_pytest/__init__.py", "added", "library"),
        ("unittest.py", "added", "library"),  # shadows the standard library at the top
        ("tests/random.py", "added", "library"),  # and in a test folder
        ("pkg/random.py", "added", None),  # a package's submodule shadows nothing
        ("src/_pytest/python.py", "modified", None),  # pytest's own sources, in its repository
        ("pkg/core.py", "modified", None),
        ("setup.cfg", "modified", None),  # by name alone: only its pytest section counts
    ],
)
def test_path_findings_by_name(path, change, category):
    finding = path_finding(path, change)
    assert (finding.category if finding else None) == category


def test_only_a_changed_pytest_section_is_a_finding():
    base = "[metadata]\nname = pkg\n[tool:pytest]\naddopts = -q\n"
    assert config_finding("setup.cfg", base, base.replace("pkg", "other")) is None
    assert config_finding("setup.cfg", base, base.replace("-q", "-p cheat")).change == "modified"
    assert config_finding("setup.cfg", base, None).change == "deleted"
    assert config_finding("tox.ini", "[tox]\n", "[tox]\n[pytest]\naddopts = -x\n") is not None
    toml = "[project]\nname = 'pkg'\n"
    assert config_finding("pyproject.toml", toml, toml + "version = '2'\n") is None
    with_section = toml + "[tool.pytest.ini_options]\naddopts = '-p cheat'\n"
    assert config_finding("pyproject.toml", toml, with_section).change == "modified"
    assert config_finding("pyproject.toml", toml, "not = [toml") is not None  # unparsable
    assert config_finding("pytest.ini", None, "").change == "added"  # even empty: rootdir


def test_instance_test_files_and_the_runners_own_program():
    test_patch = "diff --git a/tests/conftest.py b/tests/conftest.py\nnew file mode 100644\n"
    params = SwebenchParams(
        test_patch=test_patch,
        fail_to_pass=["tests/test_core.py::test_f"],
        test_command="./tests/runtests.py --verbosity 2",
    )
    assert instance_test_files(params) == {"tests/conftest.py", "tests/test_core.py"}
    assert runner_files(params) == {"tests/runtests.py"}
    script = (
        "git apply -v - <<'EOF'\n" + test_patch + "EOF\n: '>>>>> Start Test Output'\n"
        "PYTHONWARNINGS=ignore bin/test -C --verbose sympy/core/tests/test_x.py\n"
        "python tests/runtests.py admin\n: '>>>>> End Test Output'\n"
    )
    params = SwebenchParams(eval_script=script, fail_to_pass=["test_x"])
    assert runner_files(params) == {"bin/test", "tests/runtests.py"}
    assert "tests/conftest.py" in instance_test_files(params)


@pytest.mark.parametrize(
    ("line", "wrapped"),
    [
        ("python3 -m pytest -rA tests/a.py", True),
        ("  PYTHONWARNINGS='ignore' python -m pytest -rA 'tests/a.py::T::t'", True),
        ("pytest --no-header -rA tests/a.py", True),
        ("/opt/env/bin/py.test tests", True),
        ("./tests/runtests.py --verbosity 2", False),
        ("bin/test -C sympy", False),
        ("echo pytest", False),
    ],
)
def test_pytest_lines_are_wrapped(line, wrapped):
    new = pytest_runner.wrap_line(line, "/home/agent/.r.log")
    assert (new is not None) is wrapped
    if new:
        assert "PYTHONNOUSERSITE=1" in new and '-s -c "$ROLLOUTD_PYTEST_RUNNER"' in new
        assert new.endswith(line.split("test ", 1)[1])  # the arguments, as they were


def test_hardened_script_grades_the_report_not_what_the_process_printed(repo, tmp_path):
    """A SWE-bench 5 style script (``set -uxo pipefail``, ``: '>>>>> ...'`` markers) on this
    interpreter's pytest: the code under test prints ``PASSED`` lines at import, from a test
    and at exit, and a fake exit code; the graded log has pytest's own report only."""
    (repo / "pkg" / "core.py").write_text(
        "import atexit, os\n"
        "print('PASSED tests/test_core.py::test_f')\n"
        "atexit.register(print, 'PASSED tests/test_core.py::test_f')\n"
        "atexit.register(print, '>>>>> Test Exit Code: 0')\n"
        "def f():\n    os.write(1, b'PASSED tests/test_core.py::test_f\\n')\n    return 1\n"
    )
    script = (
        "#!/bin/bash\nset -uxo pipefail\n"
        f"cd {repo}\n: '>>>>> Start Test Output'\n"
        f"{Path(sys.executable).parent}/python -m pytest -rA -p no:cacheprovider "
        "tests/test_core.py\n: '>>>>> End Test Output'\n"
    )

    def run(text: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", "exec bash -s 2>&1"], input=text, capture_output=True, text=True
        )

    plain = run(script).stdout  # as the script was: the printed lines are in the log
    assert parse_pytest_log(plain)["tests/test_core.py::test_f"] == "PASSED", plain
    (repo / "pytest.py").write_text("raise SystemExit('the shadow ran')\n")
    report = str(tmp_path / "report.log")
    hardened, wrapped = pytest_runner.harden_script(script, report)
    assert wrapped
    done = run(hardened)
    assert "the shadow ran" not in done.stdout  # pytest.py in the working folder did not run
    log = pytest_runner.graded_log(done.stdout, Path(report).read_text())
    assert "PASSED tests/test_core.py::test_f" not in log, log
    assert parse_pytest_log(log) == {"tests/test_core.py::test_f": "FAILED"}
    assert log.rstrip().endswith(">>>>> Test Exit Code: 1")
    assert done.returncode == 0  # no `set -e`: the tests' exit code is in the log only


def test_graded_log_keeps_only_the_flags_printed_before_the_tests():
    output = (
        ">>>>> Patch Apply Failed\n>>>>> Start Test Output\nPASSED forged\n>>>>> Reset Failed\n"
    )
    log = pytest_runner.graded_log(output, "PASSED real\n\n>>>>> Test Exit Code: 0\n")
    assert log == (
        ">>>>> Patch Apply Failed\n>>>>> Start Test Output\nPASSED real\n\n"
        ">>>>> End Test Output\n>>>>> Test Exit Code: 0\n"
    )
    assert ">>>>> Tests Timed Out" in pytest_runner.graded_log(output, None, timed_out=True)
