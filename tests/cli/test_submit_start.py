"""``rolloutd submit`` right after ``rolloutd up &`` (docs/task_sets.md runs the two so): it
waits while the stack on its home is still starting, and where no Temporal answers it says so
in one line with what to do, exit 1, no traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from rolloutd.stack.state import StackState, write_state


def test_submit_waits_for_a_starting_stack_then_names_a_missing_temporal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # a stack starting on this home: this process stands in for its `up` (alive, its pid)
    write_state(home, StackState(home=str(home)))
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tasks = tmp_path / "tasks.jsonl"
    task = {"task_id": "t", "instruction": "x", "harness": {"type": "shell", "command": "true"}}
    tasks.write_text(json.dumps(task) + "\n")
    delay_s = 3.0

    def runs() -> None:
        time.sleep(delay_s)
        write_state(home, StackState(home=str(home), phase="running"))

    flip = threading.Thread(target=runs)
    flip.start()
    began = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rolloutd.cli",
            "submit",
            str(tasks),
            "--address",
            f"127.0.0.1:{port}",
        ],
        env={**os.environ, "ROLLOUTD_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,  # far below the wait's bound: it ended because the stack ran
    )
    took_s = time.monotonic() - began
    flip.join()
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert f"waiting for the `rolloutd up` stack on {home} to start" in lines
    assert lines[-1].startswith(f"no Temporal answers at 127.0.0.1:{port}")
    assert "`rolloutd up`" in lines[-1] and "--address" in lines[-1]
    assert took_s >= delay_s  # it waited for the stack
