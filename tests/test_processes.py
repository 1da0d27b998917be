"""``rolloutd.processes``: a spawned child and its grandchildren stop together by process
group; start ticks name one process; ``run_until_sigterm``: SIGTERM unwinds the coroutine
(its ``finally`` runs) and the process exits 143, where a ``sys.exit`` from a plain signal
handler left servers running. Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rolloutd.processes import (
    free_port,
    group_members,
    kill_process_group_of,
    process_start_ticks,
    signal_group,
    spawn,
    stop_processes,
)

SCRIPT = """
import asyncio, sys
from pathlib import Path
from rolloutd.processes import run_until_sigterm

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
    from rolloutd.processes import run_until_sigterm

    async def main() -> int:
        return 7

    assert run_until_sigterm(main()) == 7


#: a child that starts a grandchild in its own group and ignores SIGTERM (so SIGKILL is needed)
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
print("ready", flush=True)
time.sleep(3600)
"""


def _wait_members(pgid: int, count: int) -> list[int]:
    deadline = time.monotonic() + 30
    while len(members := group_members(pgid)) < count:
        assert time.monotonic() < deadline, f"group {pgid} has {members}"
        time.sleep(0.05)
    return members


def test_stop_processes_kills_a_stubborn_child_and_its_grandchild(tmp_path: Path) -> None:
    proc = spawn([sys.executable, "-c", STUBBORN], log_path=tmp_path / "out.log")
    members = _wait_members(proc.pid, 2)
    assert proc.pid in members  # the child leads its own group
    killed = stop_processes([proc], grace_s=0.5)
    assert killed == [proc.pid]
    deadline = time.monotonic() + 30
    while any(process_start_ticks(pid) is not None for pid in members):
        assert time.monotonic() < deadline, "the grandchild outlived the stop"
        time.sleep(0.05)
    assert group_members(proc.pid) == []


def test_signal_group_spares_the_pid_it_is_told_to_spare(tmp_path: Path) -> None:
    proc = spawn([sys.executable, "-c", STUBBORN.replace("SIG_IGN", "SIG_DFL")])
    try:
        members = _wait_members(proc.pid, 2)
        assert signal_group(proc.pid, signal.SIGKILL, spare=proc.pid) == len(members) - 1
        assert proc.poll() is None  # the spared leader still runs
    finally:
        stop_processes([proc], grace_s=5)


def test_kill_process_group_of_a_member_and_of_a_gone_pid() -> None:
    proc = spawn([sys.executable, "-c", "import time; time.sleep(3600)"])
    assert kill_process_group_of(proc.pid) is True
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert kill_process_group_of(proc.pid) is False


def test_start_ticks_name_a_live_process_and_none_for_a_gone_one() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert process_start_ticks(proc.pid) is None
    assert process_start_ticks(os.getpid()) == process_start_ticks(os.getpid()) > 0


def test_free_port_can_be_bound() -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
