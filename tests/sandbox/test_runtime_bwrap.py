"""Isolation of the bwrap runtime: read-only system, namespaces, capabilities, network."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time

import pytest

from rolloutd.sandbox.config import NPM_PREFIX_ENV
from rolloutd.sandbox.runtimes import bwrap, uids

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]


async def test_workspace_writable_system_read_only(make_runtime):
    runtime = await make_runtime("bwrap")
    assert runtime.workdir == "/workspace"
    ok = await runtime.exec("echo data > /workspace/f && cat f")
    assert ok.exit_code == 0 and ok.stdout == "data\n"
    for path in (
        "/usr/rolloutd-test",
        "/etc/rolloutd-test",
        "/opt/rolloutd-test",
        "/bin/rolloutd-test",
    ):
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
    result = await runtime.exec(
        "echo $$; tr '\\0' ' ' < /proc/1/cmdline; echo; ls /proc | grep -c '^[0-9]'"
    )
    own_pid, init, num_visible = result.stdout.split("\n")[:3]
    # the exec server is pid 1, then its shims and their commands
    assert "rolloutd-exec-server" in init
    assert 1 < int(own_pid) < 100
    host_visible = sum(1 for entry in os.listdir("/proc") if entry.isdigit())
    assert int(num_visible) < 10 < host_visible


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
    # sh and sleep (the exec server and its shims are in the holder's group, not counted)
    assert await wait_for(lambda: len(runtime_pids(runtime)) >= 2)
    await runtime.stop()
    assert runtime_pids(runtime) == []


async def test_what_a_command_leaves_behind_dies_with_it(make_runtime, runtime_pids):
    runtime = await make_runtime("bwrap")
    # a background child in the group and a setsid daemon that left it: both outlive the shell
    result = await runtime.exec(
        "sleep 1000 > /dev/null 2>&1 & "
        "setsid sleep 1000 > /dev/null 2>&1 < /dev/null & echo started"
    )
    assert result.stdout == "started\n"
    assert runtime_pids(runtime) == []  # the command's shim killed them before reporting


async def test_daemon_of_a_running_harness_lives_until_the_harness_ends(
    make_runtime, runtime_pids, wait_for
):
    runtime = await make_runtime("bwrap", grace_s=0.5)
    harness = await runtime.spawn(
        "setsid sleep 1000 > /dev/null 2>&1 < /dev/null & echo ready; sleep 1000"
    )
    assert await wait_for(lambda: "ready" in harness.stdout_path.read_text())
    # sh, its sleep and the daemon; an exec meanwhile does not touch them
    assert await wait_for(lambda: len(runtime_pids(runtime)) == 3)
    assert (await runtime.exec("true")).exit_code == 0
    assert len(runtime_pids(runtime)) == 3
    await harness.terminate()
    assert runtime_pids(runtime) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="shims share the commands' uid unless root")
async def test_a_command_cannot_signal_its_shim(make_runtime):
    runtime = await make_runtime("bwrap")
    # the shim stays the exec server's user; only its command's child drops to the sandbox's
    killer = await runtime.exec("kill -KILL $PPID; echo $?; kill -STOP $PPID; echo $?")
    assert killer.stdout.split() == ["1", "1"], killer
    assert killer.exit_code == 0


@pytest.mark.parametrize("shared_uid", [False, True], ids=["own-uid", "shared-uid"])
async def test_the_end_of_a_run_kills_what_it_left_even_without_its_shim(
    make_runtime, runtime_pids, monkeypatch, shared_uid
):
    if shared_uid:  # as a worker that is not root runs it: commands share the shims' uid
        monkeypatch.setattr(bwrap, "can_run_as_sandbox_user", lambda: False)
    elif os.geteuid() != 0:
        pytest.skip("commands run as another uid only under a root worker")
    runtime = await make_runtime("bwrap", grace_s=0.5)
    # a daemon that left the harness's group, then the harness kills its own shim (refused
    # under another uid) and exits 3
    harness = await runtime.spawn(
        "setsid sleep 1000 > /dev/null 2>&1 < /dev/null & "
        "kill -KILL $PPID 2> /dev/null; sleep 0.5; exit 3"
    )
    # reported by its shim, or with the shim gone by pid 1, which reaped the orphaned harness
    assert await harness.wait(10) == 3
    assert harness.shim_lost is shared_uid and not harness.exit_lost
    if shared_uid:  # no shim cleaned up after the harness: its daemon runs on
        assert len(runtime_pids(runtime)) == 1
    await runtime.cancel()  # the end of the run: pid 1 kills every other process
    assert runtime_pids(runtime) == []
    assert (await runtime.exec("echo on")).stdout == "on\n"  # fresh shims serve the next


async def test_a_command_that_kills_its_shim_at_once_is_still_reported(make_runtime, monkeypatch):
    # shared uid: the command can kill its shim; the shim reports the pid before the command
    # runs, so even a kill as its first act leaves an exit the exec server reports
    monkeypatch.setattr(bwrap, "can_run_as_sandbox_user", lambda: False)
    runtime = await make_runtime("bwrap")
    for _ in range(20):
        process = await runtime.spawn("kill -KILL $PPID; exit 5")
        assert await process.wait(10) == 5 and process.shim_lost
    assert (await runtime.exec("echo on")).stdout == "on\n"


async def test_the_end_of_a_run_kills_an_orphaned_fork_bomb(
    make_runtime, runtime_pids, wait_for, monkeypatch
):
    # commands share the shims' uid (a worker that is not root): the harness kills its shim,
    # so its fork bomb is pid 1's child and only the end of the run's kill can reach it
    monkeypatch.setattr(bwrap, "can_run_as_sandbox_user", lambda: False)
    runtime = await make_runtime("bwrap", max_processes=64)
    bomb = (
        "import os, time\nwhile True:\n    try:\n        os.fork()\n"
        "    except OSError:\n        time.sleep(0.01)"
    )
    harness = await runtime.spawn(
        f"setsid python3 -c '{bomb}' > /dev/null 2>&1 < /dev/null & kill -KILL $PPID; exit 0"
    )
    assert await harness.wait(10) == 0 and harness.shim_lost
    assert await wait_for(lambda: len(runtime_pids(runtime)) >= 32, timeout_s=30)
    await runtime.cancel()
    assert runtime_pids(runtime) == []
    assert (await runtime.exec("echo on")).stdout == "on\n"


#: tries to open the exec server's control socket, read its environment and memory, attach to it.
PEEK = """
import ctypes, os
for name in os.listdir("/proc/1/fd") if os.access("/proc/1/fd", os.R_OK) else []:
    try:
        os.close(os.open(f"/proc/1/fd/{name}", os.O_RDWR))
        print("fd:opened", name)
        break
    except OSError:
        pass
else:
    print("fd:denied")
for path in ("/proc/1/environ", "/proc/1/mem"):
    try:
        open(path, "rb").close()
        print(path.rsplit("/", 1)[1] + ":opened")
    except OSError:
        print(path.rsplit("/", 1)[1] + ":denied")
PTRACE_ATTACH = 16
libc = ctypes.CDLL(None, use_errno=True)
print("ptrace:" + ("attached" if libc.ptrace(PTRACE_ATTACH, 1, None, None) == 0 else "denied"))
"""


async def test_sandbox_cannot_reach_the_exec_server(make_runtime):
    runtime = await make_runtime("bwrap")
    # the exec server (pid 1) runs as root, commands as another uid, and it is not dumpable: its
    # fds (the control socket), environment and memory cannot be opened, nor can it be traced
    result = await runtime.exec(["python3", "-c", PEEK], timeout_s=30)
    assert result.stdout.split() == [
        "fd:denied",
        "environ:denied",
        "mem:denied",
        "ptrace:denied",
    ], result
    assert (await runtime.exec("cat /proc/1/cmdline")).stdout.startswith("/")  # it is there


async def test_the_sandbox_cannot_kill_the_exec_server(make_runtime):
    runtime = await make_runtime("bwrap")
    # the namespace's init ignores signals from inside, and commands run as another uid
    killer = await runtime.exec("kill -KILL 1; echo $?; kill -TERM 1; echo $?")
    if runtime.uid >= 0:  # another uid: refused outright (else silently ignored)
        assert killer.stdout.split() == ["1", "1"], killer
    assert (await runtime.exec("true")).exit_code == 0


async def test_killing_the_exec_server_ends_the_sandbox_not_the_worker(
    make_runtime, runtime_pids, wait_for
):
    runtime = await make_runtime("bwrap")
    harness = await runtime.spawn("sleep 1000")
    running = await runtime.spawn("sleep 1000", name="other")
    # killed from the host (it is pid 1 inside), the exec server takes the PID namespace with it
    assert runtime.exec_server_pid is not None
    os.kill(runtime.exec_server_pid, 9)
    assert await harness.wait(10) is not None
    assert await running.wait(10) is not None
    after = await runtime.exec("true")
    assert after.exit_code == 127 and "exec server is gone" in after.stderr
    # the kernel kills the rest of the namespace as its init exits
    assert await wait_for(lambda: runtime_pids(runtime) == [])


async def test_long_requests_and_the_key_stay_off_command_lines(make_runtime, wait_for):
    runtime = await make_runtime("bwrap")
    # longer than one socket message: the request travels in a memfd (each string stays
    # below execve(2)'s 128 KiB limit per argument or variable, MAX_ARG_STRLEN)
    big = await runtime.exec(
        ["sh", "-c", 'echo ${#BIG} "$1"', "sh", "y" * 100_000],
        env={"BIG": "x" * 100_000},
        max_output_bytes=1 << 20,
    )
    assert big.stdout == f"100000 {'y' * 100_000}\n", big.stderr
    harness = await runtime.spawn(
        "echo ready; sleep 1000", env={"OPENAI_API_KEY": "rolloutd-secret-key-123"}
    )
    assert await wait_for(lambda: "ready" in harness.stdout_path.read_text())
    assert _command_lines_with(b"rolloutd-secret-key-123") == []


def _command_lines_with(needle: bytes) -> list[int]:
    """Pids of host processes whose command line contains ``needle``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(entry))
            except OSError:  # exited meanwhile
                continue
    return found


@pytest.mark.skipif(
    os.geteuid() != 0, reason="commands run as the worker's own uid unless the worker is root"
)
async def test_commands_run_unprivileged_and_own_workspace_and_home(make_runtime, tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("x = 1\n")
    runtime = await make_runtime(
        "bwrap",
        files={"notes.txt": "start\n"},
        prepare=[
            {"type": "upload", "source": str(repo), "path": "repo"},
            {"type": "exec", "command": "git init -q repo && echo made > repo/pkg/new.py"},
        ],
    )
    await runtime.upload("/home/agent/.config/tool/settings.json", b"{}")
    ids = await runtime.exec("id -u; id -g; whoami; echo $HOME")
    assert ids.stdout.split() == [str(runtime.uid), str(runtime.gid), "agent", "/home/agent"]
    assert runtime.uid != 0 and runtime.gid != 0
    # files written by the worker (spec.files, a prepare upload, an upload into HOME) and by
    # commands are all writable inside, and belong to the sandbox user on the host
    write = await runtime.exec(
        "echo more >> notes.txt && echo y > repo/pkg/mod.py && "
        "echo 1 > ~/.config/tool/settings.json && "
        "touch ~/.config/tool/new.md && mkdir -p out/a && touch out/a/b "
        "&& git -C repo status --short | sort"
    )
    assert write.exit_code == 0, write.stderr
    assert write.stdout.split() == ["??", "pkg/"]
    for path in ("notes.txt", "repo/pkg/mod.py", "repo/pkg/new.py", "out/a/b"):
        assert runtime.host_path(path).stat().st_uid == runtime.uid, path
    assert (runtime.host_path("notes.txt").read_text()) == "start\nmore\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid per runtime needs a root worker")
async def test_each_runtime_runs_as_a_uid_of_its_own(make_runtime):
    first, second = await make_runtime("bwrap"), await make_runtime("bwrap")
    assert first.uid >= 0 and second.uid >= 0 and first.uid != second.uid
    for runtime in (first, second):
        ids = (await runtime.exec("id -u; id -g")).stdout.split()
        assert ids == [str(runtime.uid), str(runtime.gid)]
    await second.exec("echo mine > mine.txt")
    # a process of the first runtime's uid that reached the host reads nothing of the second
    peek = subprocess.run(
        ["python3", "-c", f"open({str(second.workspace / 'mine.txt')!r}).read()"],
        user=first.uid,
        group=first.gid,
        extra_groups=[],
        capture_output=True,
        text=True,
    )
    assert peek.returncode != 0 and "PermissionError" in peek.stderr, peek
    uid = second.uid
    await second.stop()  # its uid is free again
    assert not (uids.CLAIMS_DIR / str(uid)).exists()


async def test_memory_limit_is_a_cgroup_and_oom_kills_only_the_command(make_runtime):
    runtime = await make_runtime("bwrap", memory_mb=128)
    if runtime.cgroup is None or runtime.cgroup.memory_dir is None:
        pytest.skip("no writable memory cgroup here: memory_mb falls back to RLIMIT_AS")
    limit_file = next(
        runtime.cgroup.memory_dir / name
        for name in ("memory.max", "memory.limit_in_bytes")
        if (runtime.cgroup.memory_dir / name).exists()
    )
    assert int(limit_file.read_text()) == 128 * 2**20
    harness = await runtime.spawn("sleep 1000")
    assert runtime.num_oom_kills == 0
    # touches every page of 512 MiB: only the cgroup stops it (address space is unlimited)
    grab = await runtime.exec(["python3", "-c", "b = b'x' * (512 * 2**20); print(len(b))"])
    assert grab.exit_code == -9 and grab.oom_killed, grab
    assert runtime.num_oom_kills >= 1
    # the rest of the runtime survives: the exec server, a running harness, new commands
    assert harness.returncode is None
    after = await runtime.exec("echo alive")
    assert after.stdout == "alive\n" and not after.oom_killed
    # memory below the limit is fine
    small = await runtime.exec(["python3", "-c", "b = b'x' * (32 * 2**20); print(len(b))"])
    assert small.exit_code == 0 and small.stdout == f"{32 * 2**20}\n"


async def test_image_runs_every_command_in_one_sandbox_of_the_image(
    make_runtime, image_root, runtime_pids, wait_for
):
    runtime = await make_runtime(
        "bwrap", image=str(image_root), max_processes=32, files={"in.txt": "from the worker\n"}
    )
    result = await runtime.exec(
        "cat /etc/image-release; ls /usr; cat in.txt; echo out > f; cat f; touch /bin/x"
    )
    assert result.stdout == "rolloutd-test-image\nfrom the worker\nout\n", result
    assert "/usr" in result.stderr and "Read-only file system" in result.stderr
    assert runtime.host_path("f").read_text() == "out\n"
    if runtime.uid >= 0:  # the image's own /etc/passwd, plus the sandbox user
        assert (await runtime.exec("id -u; whoami")).stdout.split() == [str(runtime.uid), "agent"]
    # one persistent sandbox: a harness and later commands share its PID namespace, whose
    # pid 1 is the exec server (the worker's Python, not the image's: it has none)
    harness = await runtime.spawn(["sleep", "1000"])  # reported started just before its execve
    deadline = time.monotonic() + 10
    while "sleep" not in (seen := await runtime.exec("cat /proc/[0-9]*/comm")).stdout.split():
        assert time.monotonic() < deadline, seen
    assert "rolloutd-exec-server" in (await runtime.exec("cat /proc/1/cmdline")).stdout
    assert runtime.cgroup is not None and runtime.cgroup.pids()
    assert await wait_for(lambda: len(runtime_pids(runtime)) == 1)
    await runtime.stop()
    assert harness.returncode is not None
    assert runtime_pids(runtime, with_holder=True) == []
