"""Runtime latency: start, exec round trip (``true``) and teardown, p50/p99, local and bwrap.

    python3 benchmarks/runtime.py [--runs 50] [--execs 200] [--image ROOT_FOLDER]

Targets: start <= 50 ms, exec <= 5 ms at p50, with and without limits. Each start
is a fresh runtime (folders; for bwrap the sandbox and its exec server, with ``network:
gateway`` also the host side of the relay, with limits also the runtime's cgroup and moving the
exec server into it; for local nothing else); each exec is one ``Runtime.exec(["true"])`` (for
bwrap: a request to an idle shim of the exec server, a ``posix_spawn`` and the exit report), the
first one right after the start; teardown is ``Runtime.stop()``. The machine's load moves these
numbers a lot: the load average is printed with the table; repeat, compare medians.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
import time
from pathlib import Path

import structlog

from rolloutd.sandbox.runtimes import create_runtime
from rolloutd.types import RuntimeSpec

CONFIGS = {
    "local": RuntimeSpec(type="local"),
    "bwrap (network none)": RuntimeSpec(type="bwrap", network="none"),
    "bwrap (network gateway)": RuntimeSpec(type="bwrap"),
    "bwrap (gateway + limits)": RuntimeSpec(
        type="bwrap", max_processes=256, cpus=2, memory_mb=8192
    ),
}


def pct(values: list[float], q: float) -> float:
    """The q-quantile of ``values`` in milliseconds."""
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(spec: RuntimeSpec, runs: int, execs: int, root: Path) -> dict[str, list[float]]:
    """Timings in seconds: ``start``, ``exec`` and ``stop`` lists."""
    times: dict[str, list[float]] = {"start": [], "exec": [], "stop": []}
    for i in range(runs):
        runtime = create_runtime(spec, f"bench-{i}", root)
        t0 = time.perf_counter()
        await runtime.start()
        times["start"].append(time.perf_counter() - t0)
        for _ in range(max(1, execs // runs)):
            t0 = time.perf_counter()
            result = await runtime.exec(["true"])
            times["exec"].append(time.perf_counter() - t0)
            assert result.exit_code == 0, result.stderr
        t0 = time.perf_counter()
        await runtime.stop()
        times["stop"].append(time.perf_counter() - t0)
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50, help="runtimes started per config")
    parser.add_argument("--execs", type=int, default=200, help="execs per config")
    parser.add_argument("--image", help="also measure bwrap with this image root folder")
    args = parser.parse_args()
    configs = dict(CONFIGS)
    if args.image:
        configs["bwrap (image, gateway)"] = RuntimeSpec(type="bwrap", image=args.image)
        configs["bwrap (image, gateway + limits)"] = RuntimeSpec(
            type="bwrap", image=args.image, max_processes=256, cpus=2, memory_mb=8192
        )
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print("| runtime | start p50 | start p99 | exec p50 | exec p99 | teardown p50 | teardown p99 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as root:
        for name, spec in configs.items():
            t = await measure(spec, args.runs, args.execs, Path(root))
            print(
                f"| {name} | "
                + " | ".join(
                    f"{pct(t[k], q):.1f} ms" for k in ("start", "exec", "stop") for q in (0.5, 0.99)
                )
                + " |"
            )
    print("load average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    asyncio.run(main())
