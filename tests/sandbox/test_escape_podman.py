"""Escape attempts from a podman container with ``network: gateway`` (the default): each must
fail. The bwrap runtime's escape tests (tests/sandbox/test_escape_bwrap.py), extended to the
container, and run against the real services of a stack on this host.

From inside the container nothing but the session's own gateway route answers: not the Temporal
dev server, not the REST facade, not llama-server, not the gateway's other routes (another
session's, the admin routes), not any other port the host listens on, on any of its addresses.
Files and the environment of the host stay invisible, writes do not reach it, the container's
root is an unprivileged uid of the host that cannot mount, and no command can end or trace the
exec server (the container's pid 1).

``acceptance``: containers, and the session-wide stack of tests/conftest.py (a Temporal dev
server, llama-server, the four fleets); about 10 s with the stack already up (the module 66 s
here, 42 s of it starting the stack).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from rolloutd.sandbox.runtimes.podman import GATEWAY_PORT, USERNS_BASE
from rolloutd.stack import free_port
from tests.support.escape import CONNECT, FETCH

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.timeout(600),
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
]


def listening_ports() -> set[int]:
    """TCP ports some process of the host listens on (proc(5), /proc/net/tcp and tcp6: state
    0A is LISTEN)."""
    ports: set[int] = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(name).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def host_addresses() -> set[str]:
    """The host's own IPv4 addresses but loopback."""
    found = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5)
        found |= {a for a in out.stdout.split() if ":" not in a}
    return found - {"127.0.0.1"}


@pytest.fixture(scope="module")
def rest_facade(temporal_server, tmp_path_factory):
    """The REST facade as ``rolloutd rest`` serves it, on a loopback port of the host."""
    port = free_port()
    env = {**os.environ, "ROLLOUTD_STORE_URL": str(tmp_path_factory.mktemp("rest") / "store")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rolloutd.cli", "rest", "--host", "127.0.0.1", "--port", str(port)]
        + ["--address", temporal_server.address],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=2).status_code == 200:
                break
        assert proc.poll() is None and time.monotonic() < deadline, "rolloutd rest did not start"
        time.sleep(0.2)  # polling the facade's start, bounded by the deadline
    yield port
    proc.terminate()
    proc.wait(timeout=30)


async def test_nothing_but_the_sessions_gateway_answers(
    make_runtime, fleets, temporal_server, rest_facade, gateway
) -> None:
    """From the container only the session's own gateway route answers through the relay
    (another session's, the admin routes and path tricks get 403, and nothing else reaches the
    gateway); no port the host listens on, at any of its addresses, nor an outside address, can
    be reached directly, and the only interface is loopback. About 1 s here once the stack is up
    (starting it took 42 s here, in this test's setup)."""
    fake_port, seen = gateway
    services = {
        "temporal": int(temporal_server.address.rsplit(":", 1)[1]),
        "rest": rest_facade,
        "llama-server": urlsplit(fleets.engine_url).port,
        "gateway": urlsplit(fleets.gateway_url).port,
        "fake gateway": fake_port,
    }
    for port in services.values():  # every one of them answers on the host
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    runtime = await make_runtime("podman")
    assert runtime.spec.network == "gateway"
    (url,) = await runtime.connect_gateway(f"http://127.0.0.1:{fake_port}/s/KEY1/v1")
    assert url.startswith(f"http://127.0.0.1:{GATEWAY_PORT}/s/KEY1/v1")

    # through the relay: the session's own route only
    result = await runtime.exec(
        [
            "python3",
            "-c",
            FETCH,
            f"{url}/models",
            f"http://127.0.0.1:{GATEWAY_PORT}/s/OTHER/v1/models",
            f"http://127.0.0.1:{GATEWAY_PORT}/admin/backends",
            f"http://127.0.0.1:{GATEWAY_PORT}/s/KEY1/../OTHER/v1/models",
            f"http://127.0.0.1:{GATEWAY_PORT}/s/KEY1/%2e%2e/admin",
        ],
        timeout_s=60,
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "OK GET /s/KEY1/v1/models HTTP/1.1", result
    assert lines[1:] == ["ERR HTTPError 403"] * 4, result
    assert seen == ["GET /s/KEY1/v1/models HTTP/1.1"]  # nothing else reached the gateway

    # direct: every port the host listens on, at every address of the host, and the services
    ports = (listening_ports() | set(services.values())) - {GATEWAY_PORT}
    addresses = ["127.0.0.1", "localhost", "[::1]", *sorted(host_addresses())]
    targets = [f"{a}:{p}" for a in addresses for p in sorted(ports)]
    targets += ["1.1.1.1:53", "169.254.169.254:80", "10.88.0.1:7233"]
    result = await runtime.exec(["python3", "-c", CONNECT, *targets], timeout_s=600)
    lines = result.stdout.splitlines()
    assert len(lines) == len(targets), result
    reached = [t for t, line in zip(targets, lines, strict=True) if not line.startswith("ERR")]
    assert reached == [], reached
    interfaces = await runtime.exec("cat /proc/net/dev")
    assert {line.split(":")[0].strip() for line in interfaces.stdout.splitlines()[2:]} == {"lo"}


async def test_another_runtimes_session_is_not_reachable(make_runtime, gateway) -> None:
    """Two runtimes, two sessions: each reaches only its own route, though both relays point
    at the same gateway."""
    port, seen = gateway
    first, second = await make_runtime("podman"), await make_runtime("podman")
    (own,) = await first.connect_gateway(f"http://127.0.0.1:{port}/s/FIRST/v1")
    await second.connect_gateway(f"http://127.0.0.1:{port}/s/SECOND/v1")
    result = await first.exec(
        ["python3", "-c", FETCH, f"{own}/x", f"http://127.0.0.1:{GATEWAY_PORT}/s/SECOND/v1/x"]
    )
    assert result.stdout.splitlines() == ["OK GET /s/FIRST/v1/x HTTP/1.1", "ERR HTTPError 403"]
    assert seen == ["GET /s/FIRST/v1/x HTTP/1.1"]


async def test_host_files_and_environment_are_invisible(
    make_runtime, tmp_path, monkeypatch
) -> None:
    """Host files (a test file, one in the user's home, the admin token, the worker's environ,
    the runtime's logs) cannot be read from the container, the home's listing does not show
    them, and the worker's environment is not in the container's. About 1 s here."""
    monkeypatch.setenv("ROLLOUTD_ESCAPE_SECRET", "leaked-value")
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    home_secret = Path.home() / f".rolloutd-escape-test-{os.getpid()}"
    home_secret.write_text("home secret")
    try:
        runtime = await make_runtime("podman")
        for path in (
            secret,
            home_secret,
            Path.home() / ".rolloutd" / "admin_token",
            Path(f"/proc/{os.getpid()}/environ"),
            runtime.runtime_dir / "logs",
        ):
            result = await runtime.exec(["cat", str(path)])
            assert result.exit_code != 0 and "secret" not in result.stdout, (path, result)
        listing = await runtime.exec(["ls", "-a", str(Path.home())])
        assert home_secret.name not in listing.stdout
        env = await runtime.exec("env; cat /proc/1/environ | tr '\\0' '\\n'")
        assert "leaked-value" not in env.stdout and "ROLLOUTD_ESCAPE_SECRET" not in env.stdout
    finally:
        home_secret.unlink()


async def test_writes_do_not_reach_the_host(make_runtime, tmp_path) -> None:
    """A write to a host path lands in the container's own file system; the bound Python, the
    gateway socket's folder, the exec server's code, /proc/sys and /sys refuse writes; the
    workspace takes them, owned by the namespace's uid on the host. About 1 s here."""
    runtime = await make_runtime("podman")
    outside = tmp_path / "written-from-the-container"
    result = await runtime.exec(f"mkdir -p {tmp_path} && echo pwned > {outside}")
    assert not outside.exists(), result  # the container's own file system, not the host's
    for target in (
        f"{sys.base_prefix}/x",  # the Python installation, bound read-only
        "/run/rolloutd/x",  # the gateway socket's folder
        "/run/rolloutd-exec-server.pyc",  # the exec server's code
        "/proc/sys/kernel/x",
        "/sys/x",
    ):
        result = await runtime.exec(["sh", "-c", f"echo pwned > {target}"])
        assert result.exit_code != 0, target
    assert not Path(sys.base_prefix, "x").exists()
    ok = await runtime.exec("echo fine > inside.txt && cat inside.txt")
    assert ok.stdout == "fine\n" and (runtime.workspace / "inside.txt").read_text() == "fine\n"
    assert (runtime.workspace / "inside.txt").stat().st_uid == USERNS_BASE


async def test_root_inside_cannot_mount_or_end_the_exec_server(make_runtime) -> None:
    """Root inside (an unprivileged host uid) cannot mount, open a raw socket, read pid 1's
    environ or open its fds, nor end it with any signal: the exec server answers after. About
    1 s here."""
    runtime = await make_runtime("podman")
    result = await runtime.exec(
        "id -u; head -1 /proc/self/uid_map; mount -t tmpfs none /mnt && echo MOUNTED; "
        "python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)' "
        "&& echo RAW; "
        "cat /proc/1/environ > /dev/null && echo READ1; "
        "for fd in /proc/1/fd/*; do readlink $fd && echo LINK1; "
        "python3 -c 'import os, sys; os.open(sys.argv[1], os.O_RDONLY)' $fd && echo OPEN1; "
        "done; "
        "kill -INT 1; kill -TERM 1; kill -HUP 1; kill -KILL 1; true"
    )
    uid, uid_map, *rest = result.stdout.splitlines()
    assert uid == "0" and uid_map.split() == ["0", str(USERNS_BASE), "65536"], result
    # no mount, no raw socket, nothing of pid 1 readable: its fds (the control socket among
    # them) can be listed by their owner, but not opened or read (it is not dumpable)
    assert rest == [], result
    assert result.stderr.count("Permission denied") >= 4, result
    again = await runtime.exec("echo alive")  # pid 1 (the exec server) outlived the signals
    assert again.stdout == "alive\n"


async def test_an_images_symlinked_workdir_does_not_seed_host_files(make_runtime, tmp_path) -> None:
    """An image whose workdir is a symlink out of it (to a host folder's path, or ``/etc``
    through a symlinked parent): seeding the workspace resolves it inside the image only, so
    no host file lands in the workspace."""
    from rolloutd.sandbox.runtimes.podman_images import BASE_IMAGE

    host_folder = tmp_path / "host-folder"
    host_folder.mkdir()
    (host_folder / "secret.txt").write_text("host secret")
    context = tmp_path / "evil"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN ln -s {host_folder} /app && ln -s {tmp_path} /srv/up\n"
    )
    for workdir in ("/app", "/srv/up/host-folder"):
        runtime = await make_runtime("podman", build={"context": str(context)}, workdir=workdir)
        assert list(runtime.workspace.iterdir()) == [], workdir
        assert "host secret" not in (await runtime.exec("cat secret.txt")).stdout
