"""Escape attempts from a bwrap sandbox with ``network: gateway`` (the default): each must fail.

A real HTTP "gateway" listens on the host's loopback; the sandbox may reach its own session's
routes through the relay and nothing else: no other loopback port of the host, no other
session, no non-loopback address, no file that was not bound, no write outside the workspace,
no variable of the worker's environment, no root (commands run as an unprivileged uid when the
worker is root). A fork bomb is bounded by ``max_processes`` and torn down with the runtime.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from pathlib import Path

import pytest

from tests.support.escape import CONNECT, FETCH

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]


async def test_default_network_is_gateway_and_only_the_session_is_reachable(make_runtime, gateway):
    port, seen = gateway
    runtime = await make_runtime("bwrap")
    assert runtime.spec.network == "gateway"
    (url,) = await runtime.connect_gateway(f"http://127.0.0.1:{port}/s/KEY1/v1")
    assert url.startswith("http://127.0.0.1:8300/s/KEY1/v1")
    result = await runtime.exec(
        [
            "python3",
            "-c",
            FETCH,
            f"{url}/models",
            "http://127.0.0.1:8300/s/OTHER/v1/models",
            "http://127.0.0.1:8300/admin/backends",
            "http://127.0.0.1:8300/s/KEY1/../OTHER/v1/models",
            "http://127.0.0.1:8300/s/KEY1/%2e%2e/admin",
        ],
        timeout_s=30,
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "OK GET /s/KEY1/v1/models HTTP/1.1", result
    assert lines[1:] == ["ERR HTTPError 403"] * 4, result
    assert seen == ["GET /s/KEY1/v1/models HTTP/1.1"]  # nothing else reached the gateway


async def test_other_loopback_ports_of_the_host_are_unreachable(make_runtime, gateway):
    port, _ = gateway
    runtime = await make_runtime("bwrap")
    await runtime.connect_gateway(f"http://127.0.0.1:{port}/s/KEY/v1")
    result = await runtime.exec(
        [
            "python3",
            "-c",
            CONNECT,
            f"127.0.0.1:{port}",
            "127.0.0.1:22",
            "localhost:7233",
            "[::1]:" + str(port),
        ],
        timeout_s=30,
    )
    assert result.stdout.splitlines() == ["ERR ECONNREFUSED"] * 4, result


async def test_non_loopback_addresses_are_unreachable(make_runtime):
    runtime = await make_runtime("bwrap")
    host_ips = {
        addr[4][0] for addr in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    } - {"127.0.0.1"}
    targets = [
        "1.1.1.1:53",
        "8.8.8.8:443",
        "10.0.0.1:80",
        "169.254.169.254:80",
        *(f"{ip}:22" for ip in host_ips),
    ]
    result = await runtime.exec(["python3", "-c", CONNECT, *targets], timeout_s=30)
    lines = result.stdout.splitlines()
    assert len(lines) == len(targets) and all(line.startswith("ERR") for line in lines), result
    interfaces = await runtime.exec("cat /proc/net/dev")
    names = {line.split(":")[0].strip() for line in interfaces.stdout.splitlines()[2:]}
    assert names == {"lo"}


async def test_unbound_files_are_invisible(make_runtime, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    home_secret = Path.home() / f".rolloutd-escape-test-{os.getpid()}"
    home_secret.write_text("home secret")
    try:
        runtime = await make_runtime("bwrap")
        for path in (
            secret,
            home_secret,
            Path(f"/proc/{os.getpid()}/environ"),
            Path("/root/.bash_history"),
            Path("/var/log"),
        ):
            result = await runtime.exec(["cat", str(path)])
            assert result.exit_code != 0, (path, result)
            assert "secret" not in result.stdout
        listing = await runtime.exec(["ls", "-a", str(Path.home())])
        assert home_secret.name not in listing.stdout
    finally:
        home_secret.unlink()


async def test_writes_outside_the_workspace_fail(make_runtime, tmp_path):
    runtime = await make_runtime("bwrap")
    outside = tmp_path / "written-from-sandbox"
    for target in (
        "/usr/x",
        "/etc/x",
        "/opt/x",
        "/x",
        str(outside),
        "/proc/sys/kernel/x",
        "/sys/x",
        f"{runtime.runtime_dir}/logs/x",
    ):
        result = await runtime.exec(["sh", "-c", f"echo pwned > {target}"])
        assert result.exit_code != 0, target
    assert not outside.exists()
    assert not (runtime.runtime_dir / "logs" / "x").exists()
    ok = await runtime.exec("echo fine > inside.txt && cat inside.txt")
    assert ok.stdout == "fine\n"
    assert (runtime.workspace / "inside.txt").read_text() == "fine\n"


async def test_host_environment_is_not_visible(make_runtime, monkeypatch):
    monkeypatch.setenv("ROLLOUTD_ESCAPE_SECRET", "leaked-value")
    runtime = await make_runtime("bwrap")
    result = await runtime.exec("env; cat /proc/1/environ | tr '\\0' '\\n'")
    assert "leaked-value" not in result.stdout
    assert "ROLLOUTD_ESCAPE_SECRET" not in result.stdout
    inside = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    # PWD, SHLVL and _ are set by the shell inside, not inherited
    host_only = set(os.environ) - {
        "PATH",
        "HOME",
        "LANG",
        "TERM",
        "TMPDIR",
        "PWD",
        "SHLVL",
        "_",
        "OLDPWD",
    }
    assert not (host_only & set(inside)), host_only & set(inside)


@pytest.mark.skipif(
    os.geteuid() != 0, reason="commands run as the worker's own uid unless the worker is root"
)
async def test_commands_are_not_root(make_runtime):
    runtime = await make_runtime("bwrap")
    result = await runtime.exec("id -u; grep -E '^(CapEff|CapPrm|CapInh):' /proc/self/status")
    uid, *caps = result.stdout.splitlines()
    assert int(uid) != 0
    assert all(line.split()[1] == "0000000000000000" for line in caps), caps
    # root-only files of the read-only system stay unreadable (a root without capabilities,
    # as commands used to be, still owned them)
    if os.path.exists("/etc/shadow"):
        shadow = await runtime.exec(["cat", "/etc/shadow"])
        assert shadow.exit_code != 0 and "Permission denied" in shadow.stderr
    # nor can a command take another uid
    setuid = await runtime.exec(["python3", "-c", "import os; os.setuid(0)"])
    assert setuid.exit_code != 0 and "PermissionError" in setuid.stderr


async def test_fork_bomb_is_bounded_and_torn_down(make_runtime, runtime_pids, wait_for):
    limit = 48
    runtime = await make_runtime("bwrap", max_processes=limit)
    assert runtime.cgroup is not None and runtime.cgroup.dirs
    pids_max = next(d / "pids.max" for d in runtime.cgroup.dirs if (d / "pids.max").exists())
    assert pids_max.read_text().strip() == str(limit)
    # every process forks forever and retries when refused, so the bomb never dies out by
    # itself (a shell `bomb | bomb &` can collapse when its forks fail, which made this flaky)
    bomb = await runtime.spawn(
        [
            "python3",
            "-c",
            "import os, time\nwhile True:\n    try:\n        os.fork()\n"
            "    except OSError:\n        time.sleep(0.05)",
        ],
        name="bomb",
    )
    current = pids_max.parent / "pids.current"
    # the bomb fills its quota and stays there: it never exceeds it
    assert await wait_for(lambda: int(current.read_text()) >= limit - 2, timeout_s=30)
    peak = max(int(current.read_text()) for _ in range(50))
    assert peak <= limit
    assert len(runtime_pids(runtime)) <= limit
    events = (pids_max.parent / "pids.events").read_text()
    assert int(events.split()[-1]) > 0  # forks were refused
    # the host still forks fine while the bomb runs
    probe = await asyncio.create_subprocess_exec("true")
    assert await probe.wait() == 0
    cgroup_dirs = list(runtime.cgroup.dirs)
    await runtime.stop()
    assert bomb.returncode is not None
    assert runtime_pids(runtime, with_holder=True) == []
    assert not any(d.exists() for d in cgroup_dirs)
