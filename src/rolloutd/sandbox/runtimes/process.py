"""Process plumbing shared by every runtime: bounded output, termination of a runtime's
process group (the group primitives are in :mod:`rolloutd.processes`).

Every command a runtime runs is started with ``start_new_session=True``, so it leads its own
process group (pgid == pid of the launched process) and so does every child that does not call
``setsid`` itself. Termination is SIGTERM to the group, a grace period, then SIGKILL to the
group; bwrap adds a PID namespace on top, so even a child that left the group dies with it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import structlog

from rolloutd.processes import group_members, signal_group

log = structlog.get_logger(__name__)

#: how often termination polls /proc for group members that are still alive, seconds.
POLL_INTERVAL_S = 0.05


class BoundedOutput:
    """Keeps the first and last ``limit // 2`` bytes of a stream and counts the rest.

    Args:
        limit: bytes kept in total, >= 2.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(2, limit)
        self.head = bytearray()
        self.tail = bytearray()
        self.num_bytes = 0

    def feed(self, chunk: bytes) -> None:
        """Add ``chunk`` to the stream."""
        self.num_bytes += len(chunk)
        half = self.limit // 2
        room = half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.limit - half:
                del self.tail[: len(self.tail) - (self.limit - half)]

    @property
    def truncated(self) -> bool:
        """Whether bytes were dropped."""
        return self.num_bytes > len(self.head) + len(self.tail)

    def text(self) -> str:
        """The kept bytes as UTF-8 text, with a marker where bytes were dropped."""
        if not self.truncated:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", errors="replace")
        dropped = self.num_bytes - len(self.head) - len(self.tail)
        return (
            bytes(self.head).decode("utf-8", errors="replace")
            + f"\n[... {dropped} bytes truncated ...]\n"
            + bytes(self.tail).decode("utf-8", errors="replace")
        )


async def drain(stream: asyncio.StreamReader, sink: BoundedOutput) -> None:
    """Read ``stream`` to EOF into ``sink``, 64 KiB at a time."""
    while chunk := await stream.read(65536):
        sink.feed(chunk)


class RuntimeProcess:
    """A process (and its process group) started in a runtime.

    Args:
        process: the asyncio process; it leads its own process group.
        name: a short label for logs (``harness``, ``exec``).
        spare_leader_on_term: do not SIGTERM the group leader (bwrap's outer process).
        stdout_path, stderr_path: host files receiving the output, when redirected to files.
        grace_s: seconds between SIGTERM and SIGKILL in :meth:`terminate`.

    Attributes:
        pid: host pid of the launched process (for bwrap: the outer bwrap process).
        pgid: its process group id (equal to ``pid``).
    """

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        *,
        name: str,
        spare_leader_on_term: bool = False,
        stdout_path: Path | None = None,
        stderr_path: Path | None = None,
        grace_s: float = 5.0,
    ) -> None:
        self._process = process
        self.name = name
        self.pid = process.pid
        self.pgid = process.pid
        self.spare_leader_on_term = spare_leader_on_term
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.grace_s = grace_s
        self.started_at = time.monotonic()

    @property
    def returncode(self) -> int | None:
        """Exit code once the launched process exited (negative: killed by that signal)."""
        return self._process.returncode

    @property
    def process(self) -> asyncio.subprocess.Process:
        """The underlying asyncio process (for its pipes)."""
        return self._process

    async def wait(self, timeout_s: float | None = None) -> int | None:
        """Wait for the launched process to exit.

        Args:
            timeout_s: seconds to wait; None waits for ever.

        Returns:
            The exit code, or None when ``timeout_s`` passed first (the process keeps running).
        """
        try:
            return await asyncio.wait_for(asyncio.shield(self._process.wait()), timeout_s)
        except TimeoutError:
            return None

    def maybe_alive(self) -> bool:
        """Cheap :meth:`alive`: also true while exited members of the group are still zombies."""
        if self._process.returncode is None:
            return True
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        return True

    def alive(self) -> bool:
        """Whether the launched process or any member of its group still runs."""
        if self._process.returncode is None:
            return True
        try:  # cheap first: kill(2) with signal 0 fails with ESRCH when the group is empty
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        return bool(group_members(self.pgid))  # members may be zombies: look closer

    async def terminate(self, grace_s: float | None = None) -> int | None:
        """SIGTERM the process group, then SIGKILL it after the grace period.

        Returns once the launched process exited and no live process is left in its group
        (bounded: at most the grace period plus 10 s).

        Args:
            grace_s: seconds between SIGTERM and SIGKILL; default :attr:`grace_s`.

        Returns:
            The exit code of the launched process (negative: the signal that killed it).
        """
        grace = self.grace_s if grace_s is None else grace_s
        if not self.alive():
            return self.returncode
        spare = self.pid if self.spare_leader_on_term and self.returncode is None else None
        signal_group(self.pgid, signal.SIGTERM, spare=spare)
        graceful = await self._wait_gone(grace)
        if not graceful:
            if spare is not None:
                # kill the sandbox's processes first, so bwrap reaps its own children and
                # exits: killing bwrap first orphans them to init as zombies.
                signal_group(self.pgid, signal.SIGKILL, spare=spare)
                await self._wait_gone(1.0)
            signal_group(self.pgid, signal.SIGKILL)
            if not await self._wait_gone(10.0):
                log.error(
                    "runtime_process_survived_kill",
                    name=self.name,
                    pid=self.pid,
                    members=group_members(self.pgid),
                )
        log.info(
            "runtime_process_terminated",
            name=self.name,
            pid=self.pid,
            exit_code=self.returncode,
            graceful=graceful,
        )
        return self.returncode

    def close_pipes(self) -> None:
        """Close the worker's ends of the process's pipes (after :meth:`Runtime.exec`).

        A no-op here: asyncio closes a subprocess's pipes itself.
        """

    async def kill(self) -> int | None:
        """SIGKILL the process group at once; same as ``terminate(grace_s=0)``."""
        return await self.terminate(grace_s=0.0)

    async def _wait_gone(self, timeout_s: float) -> bool:
        """Poll until the leader exited and its group is empty; False when ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._process.returncode is None:
                await self.wait(min(POLL_INTERVAL_S, max(0.0, deadline - time.monotonic())))
            if self._process.returncode is not None and not group_members(self.pgid):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_INTERVAL_S)
