"""docs/fleets.svg is what scripts/draw_fleets.py draws from the code (regenerate it with
``python scripts/draw_fleets.py``), and the script refuses a session path the code does not
run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "draw_fleets.py"


def _script():
    spec = importlib.util.spec_from_file_location("draw_fleets", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_docs_fleets_svg_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_the_picture_names_every_fleet_queue_and_session_activity() -> None:
    from rolloutd import task_queues

    page = (ROOT / "docs" / "fleets.svg").read_text()
    for fleet, queue in task_queues.FLEET_QUEUES.items():
        assert f"{fleet} fleet" in page
        assert queue in page
    for activity in _script().SESSION_PATH:
        assert f">{activity}</text>" in page


def test_a_path_the_session_does_not_run_is_refused(monkeypatch) -> None:
    draw = _script()
    fleets = draw.read_fleets()
    monkeypatch.setattr(draw, "SESSION_PATH", (*draw.SESSION_PATH[:-1], "score_somehow"))
    with pytest.raises(SystemExit, match="update SESSION_PATH"):
        draw.session_steps(fleets)
