"""The reliability figures (``rolloutd reliability``) of the last ``tests/reliability`` run, as a
table (:mod:`rolloutd.cli.tables`).

The reliability tests (real processes, real kills: docs/faults.md) each record their figures
with :func:`record` into one JSON file, :func:`report_path` (``ROLLOUTD_RELIABILITY_REPORT``, else
``{ROLLOUTD_HOME}/reliability.json``); ``rolloutd reliability`` prints it.

``rolloutd reliability --run`` runs the tests first. The test suite gives itself a home of its
own (tests/conftest.py sets ``ROLLOUTD_HOME`` to a temporary folder, removed when it ends), so
the run is told where to write by name: ``ROLLOUTD_RELIABILITY_REPORT`` set to a file beside
this process's :func:`report_path`, which replaces the report once the run ends (a run that
records nothing leaves the last report as it was).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rolloutd.cli import tables
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


def table(data: dict[str, dict[str, Any]]) -> tables.Table:
    """The figures as a table: one row per scenario, the :data:`COLUMNS` first, then any other
    figure recorded; a float with one decimal, a flag ``yes``/``NO``."""
    rows = list(data.values())
    keys = [c for c in COLUMNS if any(c in r for r in rows)]
    keys += sorted({k for r in rows for k in r} - set(keys) - {"recorded_at"})
    return tables.table(
        *(k if k == "scenario" else tables.num(k) for k in keys),
        rows=([tables.cell(r.get(k), 1) for k in keys] for r in rows),
    )


def main(run: bool = False, tests: Path | str = "tests/reliability") -> int:
    """Print the table; with ``run``, run the reliability tests first and print what they
    recorded.

    Args:
        run: run ``pytest tests`` first (every test there: the acceptance tier's long kills
            and drains too), with ``ROLLOUTD_RELIABILITY_REPORT`` naming where to record.
        tests: the reliability tests' folder (or one test file).

    Returns:
        With ``run``: the pytest exit code, or 1 when the run recorded no figures; 2 when
        ``tests`` does not exist. Without: 0, or 1 when no figures exist.
    """
    path = report_path()
    code = 0
    if run:
        if not Path(tests).exists():
            print(f"no reliability tests at {Path(tests).resolve()}: run from a source checkout")
            return 2
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = path.with_name(f"{path.name}.{os.getpid()}.run")
        fresh.unlink(missing_ok=True)
        try:
            code = subprocess.call(
                # every reliability test, the acceptance tier's long kills and drains included
                [sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider"]
                + ["-m", ""],
                env={**os.environ, "ROLLOUTD_RELIABILITY_REPORT": str(fresh)},
            )
            if not fresh.is_file():
                print(f"the run recorded no reliability figures (pytest exit {code})")
                return code or 1
            fresh.replace(path)
        finally:
            fresh.unlink(missing_ok=True)
    if not path.exists():
        print(f"no reliability figures at {path}: run `rolloutd reliability --run`")
        return code or 1
    tables.show(table(json.loads(path.read_text())))
    return code
