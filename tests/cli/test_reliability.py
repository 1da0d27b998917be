"""``rolloutd reliability``: the figures the last ``tests/reliability`` run recorded, and
``--run``, which shows what its own run recorded although the test suite writes under a home
of its own (tests/conftest.py sets ``ROLLOUTD_HOME`` to a temporary folder)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = "tests/cli/reliability_probe.py"


def _reliability(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUTD_RELIABILITY_REPORT"}
    env["ROLLOUTD_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "rolloutd.cli", "reliability", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _row(shown: str, scenario: str) -> list[str]:
    """The cells of a scenario's row in the printed table (cells stand 2+ spaces apart)."""
    line = next(line for line in shown.splitlines() if line.startswith(scenario + " "))
    return re.split(r"\s{2,}", line.strip())


def test_run_shows_the_figures_its_own_run_recorded(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # control: nothing recorded yet, nothing to show
    before = _reliability(home)
    assert before.returncode == 1
    assert f"no reliability figures at {home / 'reliability.json'}" in before.stdout

    ran = _reliability(home, "--run", "--tests", PROBE)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert _row(ran.stdout, "probe scenario")[:3] == ["probe scenario", "3", "3"]
    report = json.loads((home / "reliability.json").read_text())
    # the test process wrote under the suite's own home, not under ours
    assert report["probe scenario"]["home"] != str(home)
    assert not [p.name for p in home.iterdir() if p.name.endswith((".run", ".tmp"))]

    shown = _reliability(home)
    assert shown.returncode == 0
    assert _row(shown.stdout, "probe scenario")[:3] == ["probe scenario", "3", "3"]


def test_a_run_that_records_nothing_keeps_the_last_report(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    last = {"earlier": {"scenario": "earlier", "sessions": 1, "ok": True}}
    (home / "reliability.json").write_text(json.dumps(last))
    empty = tmp_path / "no_tests"
    empty.mkdir()

    ran = _reliability(home, "--run", "--tests", str(empty))
    assert ran.returncode != 0
    assert "the run recorded no reliability figures" in ran.stdout
    assert json.loads((home / "reliability.json").read_text()) == last
