"""Shell-harness tasks on the ``local`` runtime whose rewards the test controls (no model calls).

Evaluator: ``test_on_output`` with ``test -f won`` (reward 1.0 when the session's workspace
holds a file ``won``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def local_task(task_id: str, command: str) -> dict[str, Any]:
    """A task running ``command`` in a local runtime, scored by ``test -f won``."""
    return {
        "task_id": task_id,
        "instruction": "test",
        "harness": {"type": "shell", "command": command},
        "runtime": {"type": "local"},
        "evaluator": {"type": "test_on_output", "command": "test -f won"},
    }


def all_win() -> str:
    """Every session wins: a zero-variance group."""
    return "touch won"


def first_wins(folder: Path, gate: Path | None = None) -> str:
    """Only the first session to create ``folder/won`` wins: a mixed group. With ``gate``,
    sessions wait until the test creates that file (the test decides when the task ends)."""
    wait = f"while [ ! -e {gate} ]; do sleep 0.1; done; " if gate else ""
    return f"{wait}mkdir -p {folder}; mkdir {folder}/won 2>/dev/null && touch won; true"


async def poll(
    fetch: Callable[[], Any],
    predicate: Callable[[Any], bool],
    timeout_s: float = 60.0,
    what: str = "condition",
) -> Any:
    """Poll ``await fetch()`` until ``predicate(value)``; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = await fetch()
        if predicate(value):
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what} not reached within {timeout_s} s; last: {value}")
