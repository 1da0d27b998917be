"""Runtime latency: start (provisioning), exec round trip (``true``) and teardown, p50/p95/p99,
local, bwrap and podman; and container image builds, cold and cached.

    python3 benchmarks/runtime.py [--runs 50] [--execs 200] [--image ROOT_FOLDER]
    python3 benchmarks/runtime.py --podman [--runs 30] [--builds 5] [--base]

Targets: start <= 50 ms, exec <= 5 ms at p50 for bwrap, with and without limits. Each start
is a fresh runtime (folders; for bwrap the sandbox and its exec server, with ``network:
gateway`` also the host side of the relay, with limits also the runtime's cgroup and moving the
exec server into it; for podman the image's config, the workspace's seeding from the image, a
``podman run`` and its exec server connecting back; for local nothing else); each exec is one
``Runtime.exec(["true"])`` (for bwrap and podman: a request to an idle shim of the exec server,
a fork of it, the command's drop of ids and its ``execve``, and the exit report), the first one
right after the start; teardown is ``Runtime.stop()`` (podman: ``podman rm``). The first
podman start of a process is left out (it seeds the image's workdir check and the host's Python
libraries once).

bwrap (and with ``--podman`` podman) is measured twice in each configuration: started cold, and
claimed from a warm pool (:mod:`rolloutd.sandbox.warm_pool`; start is then the claim, with a file
and an environment variable applied; the pool's refill between claims is not timed).
``--podman`` adds the podman runtime, on the Debian base image (made first when missing), and
measures image builds from a Dockerfile (``FROM`` the base
image, a copied package and a ``RUN`` that compiles it): ``cold`` is a build of a context never
built (new content), ``cached`` the same build asked again (the content hash's tag exists: no
build). ``--base`` also makes the base image's recipe once more under a throw-away tag (mmdebstrap
and import; minutes, and a Debian mirror) and removes it. The machine's load moves these numbers a
lot: the load average is printed with the table; repeat, compare medians.
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
from rolloutd.sandbox.runtimes import podman_images as images
from rolloutd.sandbox.warm_pool import POOLED_TYPES, WarmPool
from rolloutd.types import ImageBuild, RuntimeSpec

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


PODMAN_CONFIGS = {
    "podman (network none)": RuntimeSpec(type="podman", network="none"),
    "podman (network gateway)": RuntimeSpec(type="podman"),
    "podman (gateway + limits)": RuntimeSpec(
        type="podman", max_processes=256, cpus=2, memory_mb=8192
    ),
}


async def measure(spec: RuntimeSpec, runs: int, execs: int, root: Path) -> dict[str, list[float]]:
    """Timings in seconds: ``start``, ``exec`` and ``stop`` lists."""
    times: dict[str, list[float]] = {"start": [], "exec": [], "stop": []}
    if spec.type == "podman":  # once per process: the image's checks, the host's libraries
        warm = create_runtime(spec, "bench-warm", root)
        await warm.start()
        await warm.stop()
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


async def measure_pool(spec: RuntimeSpec, runs: int, execs: int, root: Path) -> dict:
    """Timings in seconds of claims from a warm pool of one runtime per key (``start`` is the
    claim: key, files written, env set), with the same execs and teardown as :func:`measure`;
    the refill between two claims is not timed (it runs ahead of demand)."""
    times: dict[str, list[float]] = {"start": [], "exec": [], "stop": []}
    pool = WarmPool(root, None, size=1)
    spec = spec.model_copy(update={"files": {"task.txt": "the task"}, "env": {"TASK": "1"}})
    assert await pool.claim(spec) is None  # the first ask of a key is a miss: it fills
    try:
        for _ in range(runs):
            while not pool.runtime_ids():
                await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            runtime = await pool.claim(spec)
            times["start"].append(time.perf_counter() - t0)
            assert runtime is not None
            for _ in range(max(1, execs // runs)):
                t0 = time.perf_counter()
                result = await runtime.exec(["true"])
                times["exec"].append(time.perf_counter() - t0)
                assert result.exit_code == 0, result.stderr
            t0 = time.perf_counter()
            await runtime.stop()
            times["stop"].append(time.perf_counter() - t0)
    finally:
        await pool.drain()
    return times


def write_context(folder: Path, n: int) -> ImageBuild:
    """A build context: a small package (``n`` makes its content new), compiled in the image."""
    (folder / "pkg").mkdir(parents=True)
    for m in range(20):
        (folder / "pkg" / f"mod{m}.py").write_text(
            "".join(f"def f{k}(x):\n    return x + {k} + {n}\n" for k in range(200))
        )
    (folder / "Dockerfile").write_text(
        f"FROM {images.BASE_IMAGE}\nCOPY pkg /app/pkg\nRUN python3 -m compileall -q /app\n"
        "WORKDIR /app\n"
    )
    return ImageBuild(context=str(folder))


async def measure_builds(num: int, root: Path) -> dict[str, list[float]]:
    """Seconds of ``num`` cold builds (new contents) and of the same builds asked again."""
    times: dict[str, list[float]] = {"cold": [], "cached": []}
    made: list[str] = []
    try:
        for n in range(num):
            build = write_context(root / f"ctx-{n}-{time.time_ns()}", time.time_ns())
            for kind in ("cold", "cached"):
                t0 = time.perf_counter()
                tag, built = await images.ensure_built("podman", build, network=False, root=root)
                times[kind].append(time.perf_counter() - t0)
                assert built == (kind == "cold"), (kind, built)
            made.append(tag)
    finally:
        for tag in made:
            await images.cli("podman", "rmi", "--", tag)
    return times


async def measure_base(root: Path) -> float:
    """Seconds to make the base image's recipe again (mmdebstrap + import) under a throw-away
    tag, removed afterwards (the real base image is not touched)."""
    rootfs, tag = root / "rootfs.tar", "localhost/rolloutd-bench-base:cold"
    t0 = time.perf_counter()
    code, out = await images.cli(
        "mmdebstrap",
        "--quiet",
        "--variant=minbase",
        f"--include={images.BASE_PACKAGES}",
        images.BASE_SUITE,
        str(rootfs),
        timeout_s=images.BASE_BUILD_TIMEOUT_S,
    )
    assert code == 0, out
    code, out = await images.cli("podman", "import", "--quiet", str(rootfs), tag)
    assert code == 0, out
    seconds = time.perf_counter() - t0
    await images.cli("podman", "rmi", "--", tag)
    rootfs.unlink()
    return seconds


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50, help="runtimes started per config")
    parser.add_argument("--execs", type=int, default=200, help="execs per config")
    parser.add_argument("--image", help="also measure bwrap with this image root folder")
    parser.add_argument("--podman", action="store_true", help="also podman and image builds")
    parser.add_argument("--builds", type=int, default=5, help="image builds (with --podman)")
    parser.add_argument("--base", action="store_true", help="also make the base image cold")
    args = parser.parse_args()
    configs = dict(CONFIGS)
    if args.podman:
        await images.ensure_base_image()
        configs |= PODMAN_CONFIGS
    if args.image:
        configs["bwrap (image, gateway)"] = RuntimeSpec(type="bwrap", image=args.image)
        configs["bwrap (image, gateway + limits)"] = RuntimeSpec(
            type="bwrap", image=args.image, max_processes=256, cpus=2, memory_mb=8192
        )
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(
        "| runtime | start p50 | start p95 | start p99 | exec p50 | exec p99 "
        "| teardown p50 | teardown p99 |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    quantiles = {"start": (0.5, 0.95, 0.99), "exec": (0.5, 0.99), "stop": (0.5, 0.99)}
    with tempfile.TemporaryDirectory() as root:
        for name, spec in configs.items():
            t = await measure(spec, args.runs, args.execs, Path(root))
            cells = [f"{pct(t[k], q):.1f} ms" for k, qs in quantiles.items() for q in qs]
            print(f"| {name} | " + " | ".join(cells) + " |")
            if spec.type in POOLED_TYPES:
                t = await measure_pool(spec, args.runs, args.execs, Path(root))
                cells = [f"{pct(t[k], q):.1f} ms" for k, qs in quantiles.items() for q in qs]
                print(f"| {name}, warm pool claim | " + " | ".join(cells) + " |")
        if args.podman and args.builds:
            builds = await measure_builds(args.builds, Path(root))
            print("\n| image build | p50 | max | runs |\n| --- | --- | --- | --- |")
            for kind, values in builds.items():
                worst = 1000 * max(values)
                print(f"| {kind} | {pct(values, 0.5):.0f} ms | {worst:.0f} ms | {len(values)} |")
        if args.base:
            print(
                f"\nbase image (mmdebstrap + import), cold: {await measure_base(Path(root)):.1f} s"
            )
    print("load average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    asyncio.run(main())
