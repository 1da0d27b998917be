"""Child processes and process groups, the one place rolloutd spawns, signals and ends them.

Every child rolloutd starts leads its own session, so its process group id is its pid and
every descendant that does not call ``setsid`` itself is in that group: stopping a child is
SIGTERM to the group, a grace period, then SIGKILL to the group (kill(2), setsid(2)). Nothing
is killed by name. A child of a long-running parent can also be tied to that parent's life
with Linux's parent-death signal (prctl(2) ``PR_SET_PDEATHSIG``).

Used by the embedded stack (``stack``), the reference engine (``engine``), the sandbox
runtimes and their reclaiming after a crash (``sandbox``), and the trainer client's commands
(:func:`end_process`, :func:`run_until_sigterm`).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import IO, Any, TypeVar

from rolloutd.errors import RolloutdError

T = TypeVar("T")

#: prctl(2) option: the signal a process gets when the thread that created it exits.
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (bound to port 0, read back, released).

    Args:
        host: the address to bind.

    Returns:
        The port number; another process may take it before the caller binds it.
    """
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    """Wait until something accepts TCP connections on ``host:port``.

    Args:
        host, port: the address to connect to.
        timeout_s: the bound on the wait, s.
        proc: the process expected to listen there; its exit ends the wait.

    Raises:
        RolloutdError: ``proc`` exited first, or nothing listens after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RolloutdError(f"process {proc.args[0]} exited with {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RolloutdError(f"nothing listens on {host}:{port} after {timeout_s} s")


def set_parent_death_signal() -> None:
    """Ask the kernel to SIGTERM this process when the thread that created it exits.

    Meant as ``preexec_fn`` (it runs in the child between fork and exec: no Python locks, one
    C call). SIGTERM, not SIGKILL, so a worker orphaned by a killed ``up`` still drains and
    stops its runtimes. prctl(2) ties the signal to the creating *thread*, not the process.
    """
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def spawn(
    command: list[str],
    *,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    die_with_parent: bool = True,
) -> subprocess.Popen[bytes]:
    """Start a child in its own session (process group = its pid), output appended to a log.

    Args:
        command: argv.
        log_path: file for stdout and stderr (None: discarded).
        env: environment (None: this process's).
        die_with_parent: the child gets SIGTERM when the creating thread exits (Linux
            ``PR_SET_PDEATHSIG``; prctl(2) ties it to the thread, so create children from a
            thread that outlives them: the main thread, or the supervisor's).

    Returns:
        The running process.
    """
    out: IO[bytes] | int = open(log_path, "ab") if log_path else subprocess.DEVNULL
    preexec = set_parent_death_signal if die_with_parent and sys.platform == "linux" else None
    try:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=preexec,
        )
    finally:
        if not isinstance(out, int):
            out.close()  # the child holds its own descriptor


def kill_group(pgid: int, sig: signal.Signals = signal.SIGKILL) -> bool:
    """Send ``sig`` to a process group.

    Args:
        pgid: the process group id (a child of :func:`spawn`: its pid).
        sig: the signal.

    Returns:
        False when the group is gone (or not this user's).
    """
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def kill_process_group_of(pid: int, sig: signal.Signals = signal.SIGKILL) -> bool:
    """Send ``sig`` to the process group ``pid`` belongs to, else to ``pid`` alone.

    Args:
        pid: any process (a group leader or a member).
        sig: the signal.

    Returns:
        False when the process is already gone (or not this user's).
    """
    try:
        os.killpg(os.getpgid(pid), sig)
        return True
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _stat_fields(pid: int | str) -> list[str] | None:
    """Fields 3 onwards of ``/proc/{pid}/stat`` (proc(5)), or None when there is no such
    process. The command name (field 2) may hold spaces and parentheses: split after the
    last ``)``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:  # the process exited, or never was
        return None
    return stat.rsplit(")", 1)[1].split()


def process_start_ticks(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (proc(5) stat field 22).

    With the pid it names one process for the life of the machine, so a recycled pid is never
    mistaken for the process recorded earlier.

    Returns:
        The ticks, or None when no such process exists.
    """
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def processes_with_env(name: str, values: set[str]) -> dict[int, str]:
    """Pids (other than this process) whose environment sets ``name`` to one of ``values``
    (``/proc/{pid}/environ``: the environment the process started with; only processes this
    one may read, its own user's or any as root).

    Returns:
        pid -> the value it carries.
    """
    wanted = {f"{name}={value}".encode(): value for value in values}
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or another user's process
        for var in environ.split(b"\0"):
            if var in wanted:
                found[int(entry.name)] = wanted[var]
                break
    return found


def group_members(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes whose process group is ``pgid``.

    Args:
        pgid: a process group id.

    Returns:
        list[int]: pids in ascending order; empty when the group is gone.
    """
    members: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)  # state ppid pgrp ...
        if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return sorted(members)


def signal_group(pgid: int, sig: signal.Signals, *, spare: int | None = None) -> int:
    """Send ``sig`` to every live member of process group ``pgid``.

    Args:
        pgid: the process group id.
        sig: the signal.
        spare: a pid not to signal (bwrap's outer process, whose death would SIGKILL the
            sandbox at once and so cut the grace period short).

    Returns:
        The number of processes signalled (1 for the whole group when nothing is spared).
    """
    if spare is None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return 0
        return 1
    count = 0
    for pid in group_members(pgid):
        if pid == spare:
            continue
        try:
            os.kill(pid, sig)
            count += 1
        except ProcessLookupError:
            continue
    return count


def stop_processes(procs: Iterable[subprocess.Popen[bytes]], grace_s: float = 10.0) -> list[int]:
    """Stop children started in their own sessions, all at once: SIGTERM to every group, wait
    up to ``grace_s`` in total, then SIGKILL the groups of those still running. The groups are
    SIGKILLed in the end in any case, so a grandchild that outlived its parent goes too.

    Args:
        procs: children from :func:`spawn` (or any ``start_new_session`` child).
        grace_s: the bound on the whole stop before SIGKILL, seconds.

    Returns:
        Pids that needed SIGKILL.
    """
    procs = [p for p in procs if p is not None]
    for proc in procs:
        if proc.poll() is None:
            kill_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    killed = []
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            killed.append(proc.pid)
            kill_group(proc.pid)
            proc.wait()
        kill_group(proc.pid)
    return killed


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """Stop a child started in its own session: SIGTERM to its group, then SIGKILL."""
    stop_processes([proc], grace_s)


def end_process(code: int) -> None:
    """End a process that used a Temporal client, skipping interpreter finalization.

    temporalio's Rust runtime (Tokio threads in ``temporal_sdk_bridge``) can call into Python
    while the interpreter finalizes; the process then dies with SIGABRT ("PyGILState_Release:
    thread state ... must be current when releasing") or SIGSEGV after its work is done, and
    its exit code is lost (temporalio/sdk-python#300, open).

    Call it last, once every ``async with``/``with`` has closed: it flushes logging and the
    standard streams, then leaves with ``os._exit(code)`` (``atexit`` handlers do not run).
    In a process that never loaded the bridge it returns, and the caller exits normally.

    Args:
        code: the exit status, 0-255.
    """
    if "temporalio.bridge.temporal_sdk_bridge" not in sys.modules:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_until_sigterm(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, with SIGTERM cancelling ``main`` like Ctrl-C does.

    ``main``'s ``finally`` blocks and ``async with`` exits then run (servers it started are
    stopped, fleets drain) and the process exits 143 (128 + SIGTERM). A ``sys.exit`` from a
    plain ``signal.signal`` handler does not do that under asyncio: it is raised inside the
    event loop's ``select``, breaks the loop, and the servers' clean-up never runs (a
    benchmark then hung with its llama-server alive).

    Returns:
        What ``main`` returns.

    Raises:
        SystemExit: 143, after ``main`` unwound on SIGTERM.
    """

    async def guarded() -> T:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await main

    try:
        return asyncio.run(guarded())
    except asyncio.CancelledError:
        raise SystemExit(128 + signal.SIGTERM) from None
