"""Isolation of the bwrap runtime: read-only system, namespaces, capabilities, network."""

from __future__ import annotations

import asyncio
import os
import shutil

import pytest

from rolloutd.sandbox.config import NPM_PREFIX_ENV

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]


async def test_workspace_writable_system_read_only(make_runtime):
    runtime = await make_runtime("bwrap")
    assert runtime.workdir == "/workspace"
    ok = await runtime.exec("echo data > /workspace/f && cat f")
    assert ok.exit_code == 0 and ok.stdout == "data\n"
    for path in ("/usr/rolloutd-test", "/etc/rolloutd-test", "/opt/rolloutd-test",
                 "/bin/rolloutd-test"):
        result = await runtime.exec(["touch", path])
        assert result.exit_code != 0, path
        assert "Read-only file system" in result.stderr or "No such file" in result.stderr
        assert not os.path.exists(path)
    tmp = await runtime.exec("echo scratch > /tmp/x && cat /tmp/x")
    assert tmp.stdout == "scratch\n"


async def test_private_tmp_and_no_host_home(make_runtime, tmp_path):
    runtime = await make_runtime("bwrap")
    await runtime.exec("echo inside > /tmp/private-file")
    assert not os.path.exists("/tmp/private-file")
    # the worker's own folders (here the test's tmp folder) are not visible
    result = await runtime.exec(["ls", str(tmp_path)])
    assert result.exit_code != 0


async def test_custom_workdir(make_runtime):
    runtime = await make_runtime("bwrap", workdir="/src/project", files={"a.py": "x = 1\n"})
    result = await runtime.exec("pwd; cat a.py")
    assert result.stdout == "/src/project\nx = 1\n"


async def test_own_pid_namespace(make_runtime):
    runtime = await make_runtime("bwrap")
    result = await runtime.exec("echo $$; ls /proc | grep -c '^[0-9]'")
    own_pid, num_visible = (int(x) for x in result.stdout.split())
    assert own_pid == 2  # bwrap's init is pid 1
    host_visible = sum(1 for entry in os.listdir("/proc") if entry.isdigit())
    assert num_visible < 10 < host_visible


async def test_capabilities_dropped_cannot_remount(make_runtime):
    runtime = await make_runtime("bwrap")
    caps = await runtime.exec("grep CapEff /proc/self/status")
    assert caps.stdout.split()[1] == "0000000000000000"
    remount = await runtime.exec("mount -o remount,rw /usr")
    assert remount.exit_code != 0
    assert (await runtime.exec(["touch", "/usr/rolloutd-test"])).exit_code != 0


async def test_python_and_node_run_inside(make_runtime):
    runtime = await make_runtime("bwrap")
    py = await runtime.exec(["python3", "-c", "import json, sys; print(sys.version_info[0])"])
    assert py.exit_code == 0 and py.stdout == "3\n", py.stderr
    if shutil.which("node"):
        node = await runtime.exec(["node", "-e", "console.log(6 * 7)"])
        assert node.exit_code == 0 and node.stdout == "42\n", node.stderr


async def test_npm_prefix_is_bound_read_only(make_runtime, tmp_path, monkeypatch):
    prefix = tmp_path / "npm"
    (prefix / "node_modules" / "pkg").mkdir(parents=True)
    (prefix / "node_modules" / "pkg" / "cli.js").write_text("console.log('cli ran')\n")
    monkeypatch.setenv(NPM_PREFIX_ENV, str(prefix))
    runtime = await make_runtime("bwrap")
    cli = prefix / "node_modules" / "pkg" / "cli.js"
    result = await runtime.exec(["cat", str(cli)])
    assert result.stdout == "console.log('cli ran')\n"
    assert (await runtime.exec(["touch", str(prefix / "x")])).exit_code != 0


async def _connect_exit_code(runtime, port: int) -> int:
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2).close()"
    return (await runtime.exec(["python3", "-c", code], timeout_s=20)).exit_code


async def test_network_host_reaches_loopback_and_none_does_not(make_runtime):
    connections = 0

    def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        host = await make_runtime("bwrap", network="host")
        assert await _connect_exit_code(host, port) == 0
        isolated = await make_runtime("bwrap", network="none")
        assert await _connect_exit_code(isolated, port) != 0
    finally:
        server.close()
        await server.wait_closed()
    assert connections == 1


async def test_setsid_child_dies_with_the_namespace(make_runtime, runtime_pids, wait_for):
    runtime = await make_runtime("bwrap")
    # a daemonised child leaves the process group; the PID namespace still takes it down
    await runtime.spawn("setsid sleep 1000 & wait")
    assert await wait_for(lambda: len(runtime_pids(runtime)) >= 3)
    await runtime.stop()
    assert runtime_pids(runtime) == []
