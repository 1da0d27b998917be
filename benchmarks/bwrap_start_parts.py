"""Where a bwrap cold start's time goes, part by part, under the sandbox fleet's default
policy (so with its default limits: a cgroup, and a sized disk when the worker can mount one).

    python3 benchmarks/bwrap_start_parts.py [--runs 60]

Each part is timed by wrapping the function that does it (``time.perf_counter`` around the
call), over ``--runs`` starts per configuration after 3 not counted:

- policy check: :func:`rolloutd.sandbox_policy.violations` at start;
- runtime folder: ``_make_runtime_dir`` (with ``disk_mb`` and a root worker: ``mkfs.ext4`` of
  a sparse image and its loop mount, :mod:`rolloutd.sandbox.runtimes.disk`);
- bwrap argv: the mount list (:meth:`BwrapRuntime.bwrap_args`);
- exec server .pyc and seccomp filter: compiled once per process, then cached;
- gateway relay: the host side of ``network: gateway``;
- spawn to sandbox pid: bwrap setting up its namespaces and mounts (``--info-fd``);
- pid to exec server ready: the exec server's Python starting inside, the cgroup move beside it;
- prime: its first shim;
- TOTAL start and stop: :meth:`Runtime.start` and :meth:`Runtime.stop` whole.

The parts that could be made ahead of a session without a running sandbox (the "prepared
root": folder and disk, argv, .pyc, filter) and those that need the sandbox running (spawn,
Python start, prime) are printed apart. The load average is printed with the table.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from rolloutd.sandbox.runtimes import base, bwrap, create_runtime, seccomp
from rolloutd.sandbox.runtimes.exec_server import ExecServerClient
from rolloutd.sandbox.runtimes.gateway_relay import GatewayRelay
from rolloutd.sandbox_policy import SandboxPolicy
from rolloutd.types import RuntimeSpec

CONFIGS = {
    "network none": RuntimeSpec(type="bwrap", network="none"),
    "network gateway": RuntimeSpec(type="bwrap"),
}
#: parts made without a running sandbox, then those of the sandbox itself.
PREPARED = ("policy check", "runtime folder", "bwrap argv", "exec server .pyc", "seccomp filter")
RUNNING = ("gateway relay", "spawn to sandbox pid", "pid to exec server ready", "prime")

times: dict[str, list[float]] = defaultdict(list)


def timed(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` with each call's seconds appended to ``times[name]``."""
    if asyncio.iscoroutinefunction(f):

        @functools.wraps(f)
        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await f(*args, **kwargs)
            finally:
                times[name].append(time.perf_counter() - t0)

        return wrapped_async

    @functools.wraps(f)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            times[name].append(time.perf_counter() - t0)

    return wrapped


def instrument() -> None:
    runtime = bwrap.BwrapRuntime
    base.violations = timed("policy check", base.violations)
    runtime._make_runtime_dir = timed("runtime folder", runtime._make_runtime_dir)
    runtime.bwrap_args = timed("bwrap argv", runtime.bwrap_args)
    bwrap.exec_server_pyc = timed("exec server .pyc", bwrap.exec_server_pyc)
    seccomp.filter_fd = timed("seccomp filter", seccomp.filter_fd)
    GatewayRelay.start = timed("gateway relay", GatewayRelay.start)
    bwrap._read_child_pid = timed("spawn to sandbox pid", bwrap._read_child_pid)
    ExecServerClient.ready = timed("pid to exec server ready", ExecServerClient.ready)
    ExecServerClient.prime = timed("prime", ExecServerClient.prime)
    runtime.start = timed("TOTAL start", runtime.start)
    runtime.stop = timed("stop", runtime.stop)


def ms(values: list[float]) -> float:
    return 1000 * statistics.median(values) if values else 0.0


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=60, help="starts per configuration")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    instrument()
    policy = SandboxPolicy()
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print("| part (p50 of each start) | " + " | ".join(CONFIGS) + " |")
    print("| --- |" + " --- |" * len(CONFIGS))
    rows: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="bwp-") as root:
        for spec in CONFIGS.values():
            times.clear()
            for i in range(args.runs + 3):
                runtime = create_runtime(spec, f"p{i}", Path(root), policy=policy)
                await runtime.start()
                await runtime.stop()
                if i < 3:
                    times.clear()  # warm-up: imports, caches
            for name in (*PREPARED, *RUNNING, "TOTAL start", "stop"):
                rows[name].append(ms(times[name]))
            rows["sum: prepared root"].append(sum(ms(times[n]) for n in PREPARED))
            rows["sum: running sandbox"].append(sum(ms(times[n]) for n in RUNNING))
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(f"{v:.2f} ms" for v in values) + " |")
    print("load average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    asyncio.run(main())
