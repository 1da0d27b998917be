"""Helpers of the command-line tests that run ``rolloutd`` as a process against the shared
fleets: gated local tasks (no model call, rewards the test decides), the command itself, and
counts read back from Temporal's visibility."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def gated_task(task_id: str, gate: Path, *, win: bool = True, **fields: Any) -> dict[str, Any]:
    """A local shell task that waits for ``gate`` to exist, then (``win``) creates ``won``;
    scored by ``test -f won``: 1.0 or 0.0, no model call (a scripted harness)."""
    command = f"while [ ! -e {gate} ]; do sleep 0.1; done; " + ("touch won" if win else "true")
    task = {
        "task_id": task_id,
        "instruction": "wait for the gate",
        "harness": {"type": "shell", "command": command},
        "runtime": {"type": "local"},
        "evaluator": {"type": "test_on_output", "command": "test -f won"},
        "phases": {"run_s": 300},
    }
    task.update(fields)
    return task


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cli_env(store_url: str) -> dict[str, str]:
    """The environment of a ``rolloutd`` process the tests start: this checkout's code, the
    fleets' store, wide tables."""
    return {
        **os.environ,
        "ROLLOUTD_STORE_URL": store_url,
        "COLUMNS": "220",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
    }


async def start_cli(*args: str, env: dict[str, str], cwd: Path | None = None) -> Any:
    """Start ``python -m rolloutd.cli ARGS`` (stdout and stderr piped apart)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rolloutd.cli",
        *args,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finish(proc: Any, timeout_s: float = 240) -> tuple[int, str, str]:
    """Wait for a started command: its exit status, stdout and stderr."""
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode, out.decode(), err.decode()


async def run_cli(
    *args: str, env: dict[str, str], timeout_s: float = 240, cwd: Path | None = None
) -> tuple[int, str, str]:
    """Run ``rolloutd ARGS`` to its end."""
    return await finish(await start_cli(*args, env=env, cwd=cwd), timeout_s)


async def count(client: Any, query: str) -> int:
    """Workflows matching a visibility query."""
    return (await client.count_workflows(query)).count


async def wait_count(client: Any, query: str, at_least: int, timeout_s: float = 60) -> int:
    """Poll until at least ``at_least`` workflows match (visibility lags a little)."""
    deadline = time.monotonic() + timeout_s
    n = 0
    while time.monotonic() < deadline:
        n = await count(client, query)
        if n >= at_least:
            return n
        await asyncio.sleep(0.2)
    raise AssertionError(f"{query}: {n} < {at_least} after {timeout_s} s")


async def interrupt(proc: Any) -> tuple[int, str, str]:
    """Ctrl-C: SIGINT to the command, then its exit status and output."""
    proc.send_signal(signal.SIGINT)
    return await finish(proc, 60)
