"""``run_until_sigterm``: SIGTERM unwinds the coroutine (its ``finally`` runs) and the process
exits 143, where a ``sys.exit`` from a plain signal handler left servers running."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = """
import asyncio, sys
from pathlib import Path
from rolloutd.trainer_client.process import run_until_sigterm

folder = Path(sys.argv[1])

async def main():
    try:
        (folder / "started").touch()
        await asyncio.sleep(3600)
    finally:
        await asyncio.sleep(0.1)  # an async clean-up, like a fleet's drain
        (folder / "cleaned").touch()

run_until_sigterm(main())
"""


def test_sigterm_runs_the_coroutine_s_clean_up_and_exits_143(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path)])
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
    finally:
        proc.kill()
    assert (tmp_path / "cleaned").exists()


def test_a_coroutine_that_ends_gives_its_result() -> None:
    from rolloutd.trainer_client.process import run_until_sigterm

    async def main() -> int:
        return 7

    assert run_until_sigterm(main()) == 7
