"""The ``local`` runtime: a process group in a temporary folder, no isolation.

Commands run directly on the host with the workspace as working folder and a private HOME.
The environment is not inherited from the worker (secrets stay out) except PATH. Nothing stops a
command from reading or writing elsewhere on the host: use ``bwrap`` for anything untrusted.

Ending a run (:meth:`LocalRuntime.cancel`) kills the process group of each command, then every
process that still carries the runtime's ``ROLLOUTD_RUNTIME_ID`` (a daemon that left its group
with ``setsid`` keeps its environment). A process that also starts a program with another
environment escapes both: without a PID namespace or a cgroup of its own the worker has no
list of the runtime's processes that a process inside cannot leave.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import structlog

from rolloutd.processes import processes_with_env
from rolloutd.sandbox.runtimes.base import Runtime, check_spec_network
from rolloutd.types import RuntimeSpec

log = structlog.get_logger(__name__)

#: PATH when the worker has none.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: seconds :meth:`LocalRuntime.cancel` keeps killing the runtime's marked processes.
SWEEP_TIMEOUT_S = 5.0


class LocalRuntime(Runtime):
    """A runtime of plain host processes; see the module docstring for what it does not isolate.

    ``spec.network`` must be ``host``; ``spec.image`` is ignored; ``memory_mb`` is applied as
    RLIMIT_AS through ``prlimit``; ``max_processes`` is not enforced (see bwrap.py).
    """

    type = "local"

    def __init__(self, spec: RuntimeSpec, runtime_id: str, root: Path, **kwargs: Any) -> None:
        check_spec_network(spec, ("host",), "local")
        super().__init__(spec, runtime_id, root, **kwargs)

    def _wrap(self, argv: list[str], cwd: str) -> tuple[list[str], Path | None]:
        prefix = (
            ["prlimit", f"--as={self.spec.memory_mb * 2**20}", "--"] if self.spec.memory_mb else []
        )
        return prefix + argv, Path(cwd)

    def _base_env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", DEFAULT_PATH),
            "HOME": self.home,
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.runtime_dir / "tmp"),
            "ROLLOUTD_RUNTIME_ID": self.runtime_id,
        }

    async def _check(self) -> None:
        (self.runtime_dir / "tmp").mkdir(exist_ok=True)
        if self.spec.max_processes:
            log.warning("runtime_limit_not_enforced", runtime=self.type, limit="max_processes")

    async def cancel(self) -> None:
        """Terminate the runtime's process groups, then SIGKILL every process still carrying
        its ``ROLLOUTD_RUNTIME_ID`` (see the module docstring for what escapes)."""
        await super().cancel()
        num_killed = await asyncio.to_thread(self._kill_marked)
        if num_killed:
            log.info("runtime_swept", runtime_id=self.runtime_id, num_killed=num_killed)

    def _kill_marked(self) -> int:
        killed: set[int] = set()
        deadline = time.monotonic() + SWEEP_TIMEOUT_S
        while time.monotonic() < deadline:
            pids = processes_with_env("ROLLOUTD_RUNTIME_ID", {self.runtime_id})
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    continue
            time.sleep(0.01)  # killed processes take a moment to exit
        return len(killed)
