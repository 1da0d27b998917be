"""Fixtures and helpers of the sandbox tests: runtimes that are always stopped, and a /proc
scan that finds every process belonging to a runtime."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from rolloutd.sandbox.runtimes import Runtime, create_runtime
from rolloutd.sandbox.runtimes.podman import ROOT_LABEL
from rolloutd.sandbox.warm_pool import WarmPool
from rolloutd.types import RuntimeSpec

HAVE_BWRAP = shutil.which("bwrap") is not None
HAVE_PODMAN = shutil.which("podman") is not None

#: runtime types to parametrize over; bwrap tests carry the `sandbox` marker, podman tests
#: (containers) the `acceptance` one.
RUNTIME_TYPES = [
    pytest.param("local", id="local"),
    pytest.param(
        "bwrap",
        id="bwrap",
        marks=[
            pytest.mark.sandbox,
            pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap is not installed"),
        ],
    ),
    pytest.param(
        "podman",
        id="podman",
        marks=[
            pytest.mark.acceptance,
            pytest.mark.skipif(not HAVE_PODMAN, reason="podman is not installed"),
        ],
    ),
]


def _runtime_pids(runtime: Runtime, *, with_holder: bool = False) -> list[int]:
    """Live (non-zombie) host processes of ``runtime``.

    A process belongs to the runtime when its environment carries the runtime's
    ``ROLLOUTD_RUNTIME_ID`` (every command gets it and children inherit it) or its command line
    names the runtime's folder (the outer bwrap process). The bwrap runtime's network holder
    (its own process group, alive as long as the runtime) counts only with ``with_holder``;
    once the runtime is stopped nothing may be left, holder included.
    """
    marker = f"ROLLOUTD_RUNTIME_ID={runtime.runtime_id}".encode()
    folder = str(runtime.runtime_dir).encode()
    holder = getattr(runtime, "holder_pgid", None)
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
                if fields[0] == b"Z" or (
                    not with_holder and holder is not None and int(fields[2]) == holder
                ):
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:  # exited meanwhile
            continue
        if marker in environ or folder in cmdline:
            pids.append(int(entry))
    return pids


async def _wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll ``predicate`` every 20 ms until it holds or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@pytest.fixture
async def make_runtime(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Runtime]]]:
    """A factory of started runtimes; each one is stopped (and checked empty) at teardown."""
    made: list[Runtime] = []

    async def make(
        type: str = "local", runtime_id: str | None = None, grace_s: float = 2.0, **spec: object
    ) -> Runtime:
        runtime = create_runtime(
            RuntimeSpec(type=type, **spec),
            runtime_id or f"rt-{type}-{len(made)}-{os.getpid()}",
            tmp_path / "runtimes",
            grace_s=grace_s,
        )
        made.append(runtime)
        await runtime.start()
        return runtime

    yield make
    for runtime in made:
        await runtime.stop()
        assert _runtime_pids(runtime) == []


@pytest.fixture
async def pooled_make_runtime(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Runtime]]]:
    """As :func:`make_runtime`, but each runtime is claimed from a warm pool (size 1) and must
    be a hit: the first ask of a key misses and fills the pool, and the claim after the fill
    hands out a warm runtime (so the session's files and env are applied at claim). A module
    runs a test on pooled runtimes by overriding ``make_runtime`` with this fixture. At
    teardown every claimed runtime is stopped and checked empty, the pool is drained, and no
    container of the pool's root is left (``podman ps -a`` by label, where podman is)."""
    root = tmp_path / "runtimes"
    pool = WarmPool(root, None, size=1, grace_s=2.0)
    made: list[Runtime] = []

    async def make(type: str = "podman", **spec: object) -> Runtime:
        wanted = RuntimeSpec(type=type, **spec)
        runtime = await pool.claim(wanted)
        if runtime is None:  # the key's first ask: wait for its warm runtime
            assert await _wait_for(lambda: bool(pool.runtime_ids()), 120), "no warm runtime"
            runtime = await pool.claim(wanted)
        assert runtime is not None, "an exact key is a hit once the pool is filled"
        made.append(runtime)
        return runtime

    yield make
    await pool.close()
    for runtime in made:
        await runtime.stop()
        assert _runtime_pids(runtime) == []
    if not HAVE_PODMAN:
        return
    left = subprocess.run(
        ["podman", "ps", "--all", "--filter", f"label={ROOT_LABEL}={root.absolute()}", "-q"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert left == [], left


@pytest.fixture(params=RUNTIME_TYPES)
def runtime_type(request: pytest.FixtureRequest) -> str:
    """Each runtime type in turn: ``local``, then ``bwrap`` (marked ``sandbox``), then
    ``podman`` (marked ``acceptance``: containers, on the Debian base image, made here when
    missing)."""
    return request.param


@pytest.fixture
def runtime_pids() -> Callable[[Runtime], list[int]]:
    """The /proc scan: live host processes of a runtime."""
    return _runtime_pids


@pytest.fixture
def wait_for() -> Callable[..., Awaitable[bool]]:
    """Poll a predicate with a deadline."""
    return _wait_for


#: programs copied into :func:`image_root` (with the libraries they load).
IMAGE_PROGRAMS = ("sh", "cat", "id", "whoami", "ls", "touch", "sleep", "true", "env")


@pytest.fixture(scope="session")
def image_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small root folder for ``RuntimeSpec.image``: a few of the host's programs and the
    shared libraries they load (ldd(1)), at their paths, an ``/etc`` of its own and the
    ``/home/agent`` mount point; no ``/usr`` and no Python."""
    root = tmp_path_factory.mktemp("image")
    for folder in ("bin", "etc", "home/agent"):
        (root / folder).mkdir(parents=True)
    libs: set[str] = set()
    for name in IMAGE_PROGRAMS:
        program = shutil.which(name)
        if program is None:
            pytest.skip(f"{name} is not installed on this host")
        shutil.copy2(os.path.realpath(program), root / "bin" / name)
        listing = subprocess.run(["ldd", program], capture_output=True, text=True, check=True)
        for line in listing.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/"):
                libs.add(parts[2])
            elif parts and parts[0].startswith("/"):  # the dynamic loader
                libs.add(parts[0])
    for lib in libs:
        target = root / lib.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), target)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    (root / "etc" / "image-release").write_text("rolloutd-test-image\n")
    return root


@pytest.fixture
async def gateway():
    """A fake gateway on the host's loopback answering with the request line."""
    seen: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line = head.split(b"\r\n", 1)[0].decode()
        seen.append(line)
        body = line.encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (len(body), body)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield port, seen
    server.close()
    await server.wait_closed()
