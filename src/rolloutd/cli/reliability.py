"""The reliability figures (``rolloutd doctor``) of the last ``tests/reliability`` run, as a table.

The reliability tests (real processes, real kills: docs/faults.md) each record their figures
with :func:`record` into one JSON file, ``{ROLLOUTD_HOME}/reliability.json`` (or
``ROLLOUTD_RELIABILITY_REPORT``); ``rolloutd doctor`` prints it, and ``rolloutd doctor --run``
runs the tests first.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rolloutd.settings import HostSettings, default_home

#: column order of the table; any other figure is appended.
COLUMNS = (
    "scenario",
    "sessions",
    "completed",
    "failed",
    "cancelled",
    "completions_recorded",
    "engine_requests",
    "lost",
    "duplicated",
    "orphans",
    "refused",
    "status_500",
    "wrong_shape",
    "seconds",
    "ok",
)


def report_path() -> Path:
    """Where the figures are kept."""
    explicit = HostSettings().reliability_report
    return explicit if explicit else default_home() / "reliability.json"


def record(scenario: str, **figures: Any) -> None:
    """Store one scenario's figures (replacing an earlier record of the same scenario).

    Args:
        scenario: e.g. ``kill -9 sandbox worker``.
        figures: counts and booleans (see :data:`COLUMNS`).
    """
    path = report_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[scenario] = {"scenario": scenario, **figures, "recorded_at": time.time()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def table(data: dict[str, dict[str, Any]]) -> str:
    """Render the figures as a Markdown table."""
    rows = list(data.values())
    keys = [c for c in COLUMNS if any(c in r for r in rows)]
    keys += sorted({k for r in rows for k in r} - set(keys) - {"recorded_at"})
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(k, "")) for k in keys) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return str(value)


def main(run: bool = False, tests: str = "tests/reliability") -> int:
    """Print the table; with ``run``, run the reliability tests first.

    Returns:
        The pytest exit code with ``run`` (0 otherwise, or 1 when no figures exist).
    """
    code = 0
    if run:
        code = subprocess.call(
            # every reliability test, the acceptance tier's long kills and drains included
            [sys.executable, "-m", "pytest", tests, "-q", "-p", "no:cacheprovider", "-m", ""]
        )
    path = report_path()
    if not path.exists():
        print(f"no reliability figures at {path}: run `rolloutd doctor --run`")
        return code or 1
    print(table(json.loads(path.read_text())))
    return code
