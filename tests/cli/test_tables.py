"""One table style: every command's table comes from :mod:`rolloutd.cli.tables` (no other
module draws one with rich, Markdown pipes or padded columns), prints whole cells to a pipe,
and reads the same in each command."""

from __future__ import annotations

import ast
import io
import re
from pathlib import Path

from rich import box

from rolloutd.cli import checks, tables
from rolloutd.cli.reliability import table as reliability_table
from rolloutd.cli.report import print_report
from rolloutd.types import FailureCause, SessionResult, SessionStatus, TaskResult

SRC = Path(__file__).resolve().parents[2] / "src" / "rolloutd"
#: what only rolloutd.cli.tables may import: rich's table and its borders
TABLE_MODULES = {"rich.table", "rich.box"}


def _hits(source: str) -> list[str]:
    """The ways a module's source draws a table itself: an import of rich's table or borders,
    a column padded with ``ljust``/``rjust`` or a ``:<`` width, a Markdown table's rule."""
    hits = []
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and "---|" in node.value
        ):
            hits.append("a Markdown table's rule")
        if isinstance(node, ast.ImportFrom) and node.module in TABLE_MODULES:
            hits.append(f"imports {node.module}")
        if isinstance(node, ast.ImportFrom) and node.module == "rich":
            hits += [f"imports rich.{a.name}" for a in node.names if a.name == "box"]
        if isinstance(node, ast.Import):
            hits += [f"imports {a.name}" for a in node.names if a.name in TABLE_MODULES]
        if isinstance(node, ast.Attribute) and node.attr in ("ljust", "rjust"):
            hits.append(f".{node.attr}(")
    return hits + re.findall(r"\{[^{}]*:<\{?\w*\}?\}", source)


def _drawers() -> dict[str, list[str]]:
    """Per module of the package but :mod:`rolloutd.cli.tables`, its :func:`_hits`."""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        name = str(path.relative_to(SRC))
        if name != "cli/tables.py" and (hits := _hits(path.read_text())):
            found[name] = hits
    return found


def test_no_module_but_tables_draws_a_table() -> None:
    # control: the check sees each way in a module that draws one itself
    probe = (
        "from rich.table import Table\n"
        "from rich import box\n"
        "x = 'a'.ljust(3)\n"
        "y = f'{x:<8}'\n"
        "z = '|' + '---|' * 3\n"
    )
    for hit in ("rich.table", "rich.box", ".ljust(", ":<8", "Markdown"):
        assert hit in repr(_hits(probe)), hit
    assert _drawers() == {}


def test_the_house_style_and_its_cells() -> None:
    table = tables.table(
        "name", tables.num("reward"), title="t", rows=[("a", 1.0), ("b", None), ("c", True)]
    )
    assert table.box is box.SIMPLE_HEAD and not table.show_edge
    assert [c.justify for c in table.columns] == ["left", "right"]
    shown = tables.text(table).splitlines()
    assert shown[0] == "t"
    assert re.split(r"\s{2,}", shown[1]) == ["name", "reward"]
    assert set(shown[2]) == {"─"}
    assert [re.split(r"\s+", line) for line in shown[3:]] == [
        ["a", "1.00"],
        ["b", "-"],
        ["c", "yes"],
    ]
    assert tables.cell(False) == "NO" and tables.cell("") == "-" and tables.cell(2.345, 1) == "2.3"


def test_a_pipe_gets_whole_cells_up_to_its_width() -> None:
    long = "x" * 150
    out = io.StringIO()
    tables.show(tables.table("a", "b", rows=[(long, "end")]), "a line [not markup]", file=out)
    lines = out.getvalue().splitlines()
    assert any(long in line and line.rstrip().endswith("end") for line in lines), lines
    assert lines[-1] == "a line [not markup]"
    # a word longer than its share of a narrow console wraps whole, never cut with an ellipsis
    folded = tables.text(tables.table("a", "b", rows=[(long, long)]), width=80)
    assert "…" not in folded and "".join(folded.split()).count("x") == 300
    assert "\x1b[" not in out.getvalue()  # no colour codes in a log


def _session(index: int, **fields: object) -> SessionResult:
    values: dict = {
        "session_id": f"t/{index}",
        "task_id": "t",
        "status": SessionStatus.COMPLETED,
        "num_completions": 2,
        "reward": 1.0,
    }
    values.update(fields)
    return SessionResult(**values)


def test_commands_print_the_same_style(capsys) -> None:
    """submit's report, doctor's rows and reliability's figures: one header rule each, the
    same separator, numbers on the right."""
    failed = _session(
        1,
        status=SessionStatus.FAILED,
        reward=None,
        failure=FailureCause(kind="backend", phase="run", message="down", retryable=True),
    )
    print_report([TaskResult(task_id="t", sessions=[_session(0), failed])], 1.0)
    report = capsys.readouterr().out
    doctor = tables.text(
        checks.render([checks.ok("bwrap", "0.9"), checks.miss("podman", "absent", "install it")])
    )
    reliability = tables.text(
        reliability_table({"kill": {"scenario": "kill", "sessions": 3, "seconds": 1.25}})
    )
    for shown in (report, doctor, reliability):
        rules = [line for line in shown.splitlines() if line and set(line) == {"─"}]
        assert len(rules) == 1, shown
    row = next(line for line in report.splitlines() if line.startswith("t/1 "))
    assert re.split(r"\s{2,}", row)[:4] == ["t/1", "failed", "backend/run", "-"]
    assert "failures by kind: backend 1, none 1" in report
    assert re.split(r"\s{2,}", next(x for x in doctor.splitlines() if x.startswith("MISS"))) == [
        "MISS",
        "podman",
        "absent",
        "install it",
    ]
    assert "2 checks: 1 ok, 1 missing, 0 skipped" in doctor
    assert re.split(r"\s{2,}", doctor.splitlines()[0].strip()) == [
        "status",
        "check",
        "detail",
        "fix",
    ]
    kill = next(line for line in reliability.splitlines() if line.startswith("kill "))
    assert re.split(r"\s{2,}", kill) == ["kill", "3", "1.2"]
