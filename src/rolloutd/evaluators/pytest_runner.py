"""pytest run so that the code under test cannot write the log its grader reads.

SWE-bench grades the text pytest prints (``-rA``'s short summary, read by its log parsers). Run
as ``python -m pytest`` in the repository, anything the repository's code prints lands in that
text too: a line ``PASSED tests/x.py::test_y`` printed at exit (``atexit``), written to file
descriptor 1, or printed by a child process; and ``python -m`` puts the working folder first on
``sys.path``, so a ``pytest.py`` there replaces the runner itself. Here each pytest command
line of an eval script (between SWE-bench's ``>>>>> Start Test Output`` / ``End Test Output``
markers) runs through :data:`RUNNER`, a few lines of Python given with ``-c``, which

- imports pytest with neither ``''`` nor the working folder on ``sys.path`` (what Python 3.11's
  ``-P`` / ``PYTHONSAFEPATH`` does, on every Python an image may have), then puts the working
  folder back first for ``python -m pytest`` lines (the repository stays importable as before);
  user site-packages are off (``-s``, ``PYTHONNOUSERSITE=1``);
- opens the report file (``O_CREAT | O_EXCL | O_NOFOLLOW``) outside the repository, in the
  runtime's HOME under a name drawn per run (:func:`report_path`), and makes it pytest's
  terminal (``sys.stdout`` when pytest starts: its terminal reporter writes there, while the
  code's own output goes to the process's file descriptors 1 and 2, or to pytest's capture);
  ``--show-capture=no`` keeps captured output out of the report (a test's printed
  ``PASSED`` line would otherwise be in it);
- writes pytest's exit code last and leaves with ``os._exit`` (no ``atexit`` handler of the
  code under test runs after the report).

The worker reads the report host-side (:meth:`Runtime.download`) and :func:`graded_log` makes
the log the parsers read: the bad-run flags the script printed before the tests started (patch
apply or reset failures; no code of the session has run by then), the markers, the report, the
exit code. Nothing the process printed after the start marker is graded.

What this does not stop: the code under test runs inside pytest's process and can subvert it
there on purpose (monkeypatch pytest's reports, find the report's descriptor); SWE-bench's own
harness shares that limit. A test command that is not pytest (Django's ``runtests.py``,
SymPy's ``bin/test``) runs as the script says, and its log is the script's output.
"""

from __future__ import annotations

import re
import secrets
import shlex

#: SWE-bench's log markers (``swebench.harness.constants``).
START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
TEST_EXIT_CODE = ">>>>> Test Exit Code"
#: what an eval script prints when its reset, test patch or tests went wrong (the same module).
BAD_RUN_FLAGS = (
    ">>>>> Patch Apply Failed",
    ">>>>> Reset Failed",
    ">>>>> Tests Errored",
    ">>>>> Tests Timed Out",
)
#: the shell variable holding :data:`RUNNER` in a hardened script.
RUNNER_VARIABLE = "ROLLOUTD_PYTEST_RUNNER"

#: ``python -s -c RUNNER REPORT KEEP_CWD pytest-args...``: Python 3.5+ syntax (no f-strings),
#: since SWE-bench's environments go back that far.
RUNNER = r"""
import os, sys
def _rolloutd_run():
    report_path, keep_cwd, args = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    report = os.fdopen(os.open(report_path, flags, 384), "w")
    code = 3
    try:
        import pytest
        if keep_cwd:
            sys.path.insert(0, cwd)
        version = tuple(int(p) for p in pytest.__version__.split(".")[:2] if p.isdigit())
        if version >= (3, 5):
            args = ["--show-capture=no"] + args
        sys.argv[1:] = args
        sys.stdout = report
        code = int(pytest.main(args))
    except BaseException:
        import traceback
        traceback.print_exc(file=report)
    finally:
        try:
            report.write("\n>>>>> Test Exit Code: %d\n" % code)
            report.flush()
        finally:
            os._exit(code)
_rolloutd_run()
"""

#: a pytest command at the start of a shell line: optional ``NAME=value`` assignments, then
#: ``python[3[.x]] -m pytest`` or ``pytest`` / ``py.test`` (any folder), then the arguments.
PYTEST_LINE = re.compile(
    r"^(?P<indent>\s*)"
    r"(?P<env>(?:[A-Za-z_][A-Za-z0-9_]*=(?:'[^']*'|\"[^\"]*\"|\S*)\s+)*)"
    r"(?:(?P<python>(?:\S*/)?python(?:3(?:\.\d+)?)?)\s+-m\s+pytest"
    r"|(?P<console>(?:\S*/)?(?:pytest|py\.test)))"
    r"(?P<rest>(?:\s.*)?)$"
)


def report_path(home: str) -> str:
    """A fresh report path in the runtime's HOME (outside the repository), 128 random bits
    in its name."""
    return f"{home.rstrip('/')}/.rolloutd-tests-{secrets.token_hex(16)}.log"


def wrap_line(line: str, report: str) -> str | None:
    """The shell line running ``line``'s pytest command through :data:`RUNNER`, or None when
    ``line`` runs no pytest command."""
    match = PYTEST_LINE.match(line)
    if match is None:
        return None
    python = match["python"] or '"$ROLLOUTD_PYTHON"'
    keep_cwd = "1" if match["python"] else "0"
    return (
        f"{match['indent']}{match['env']}PYTHONNOUSERSITE=1 {python} -s "
        f'-c "${RUNNER_VARIABLE}" {shlex.quote(report)} {keep_cwd}{match["rest"]}'
    )


def harden_script(script: str, report: str) -> tuple[str, bool]:
    """``script`` with its pytest command lines between the markers run through
    :data:`RUNNER` writing to ``report``; the runner's source is set just before the start
    marker's line.

    Returns:
        ``(script, wrapped)``: ``wrapped`` is False (and the script unchanged) when no line
        between the markers runs pytest, or the markers are missing.
    """
    lines = script.splitlines()
    start = next((i for i, line in enumerate(lines) if START_TEST_OUTPUT in line), None)
    end = next((i for i, line in enumerate(lines) if END_TEST_OUTPUT in line), None)
    if start is None or end is None or end < start:
        return script, False
    wrapped = False
    for i in range(start + 1, end):
        new = wrap_line(lines[i], report)
        if new is not None:
            lines[i], wrapped = new, True
    if not wrapped:
        return script, False
    preamble = [
        f"{RUNNER_VARIABLE}=$(cat <<'ROLLOUTD_RUNNER_EOF'",
        *RUNNER.strip("\n").splitlines(),
        "ROLLOUTD_RUNNER_EOF",
        ")",
        'ROLLOUTD_PYTHON="$(command -v python3 || command -v python)"',
    ]
    return "\n".join([*lines[:start], *preamble, *lines[start:]]) + "\n", True


def graded_log(output: str, report: str | None, *, timed_out: bool = False) -> str:
    """The log SWE-bench's parsers read for a hardened run: the bad-run flags the script
    printed before the tests started, the runner's report between the markers, and the exit
    code the runner wrote last, after them (where SWE-bench's eval scripts print it).

    Args:
        output: the script's stdout and stderr.
        report: the report file's text; None when the runner never wrote one.
        timed_out: the script was killed at its time limit.
    """
    cut = output.find(START_TEST_OUTPUT)
    before = output if cut < 0 else output[:cut]
    flags = [flag for flag in BAD_RUN_FLAGS if flag in before]
    if timed_out:
        flags.append(BAD_RUN_FLAGS[-1])
    if cut < 0:
        return "\n".join(flags) + "\n"
    lines = (report or "rolloutd: the test runner wrote no report").rstrip("\n").splitlines()
    exit_line = lines.pop() if lines and lines[-1].startswith(TEST_EXIT_CODE) else None
    tail = [exit_line] if exit_line else []
    return "\n".join([*flags, START_TEST_OUTPUT, *lines, END_TEST_OUTPUT, *tail]) + "\n"
