"""Behaviour every runtime shares, run on local and on bwrap (``runtime_type`` fixture)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from rolloutd.errors import ConfigError, NotFoundError, PathRefusedError, RolloutdError
from rolloutd.sandbox.runtimes import create_runtime
from rolloutd.types import RuntimeSpec

#: a process tree whose every member outlives any test unless it is killed.
TREE = "sleep 1000 & sleep 1000 & wait"


async def test_start_writes_files_and_exec_reads_them(runtime_type, make_runtime):
    """The spec's files are in the workspace at start; exec returns the exit code, stdout and
    stderr apart, its duration, and neither timed out nor truncated. Its podman case
    (acceptance) takes about 2 s here."""
    runtime = await make_runtime(runtime_type, files={"pkg/a.txt": "alpha\n", "b.txt": "beta"})
    result = await runtime.exec("cat pkg/a.txt b.txt; echo oops >&2; exit 3")
    assert result.exit_code == 3
    assert result.stdout == "alpha\nbeta"
    assert result.stderr == "oops\n"
    assert not result.timed_out and not result.truncated
    assert result.duration_s > 0


async def test_exec_argv_env_cwd_and_stdin(runtime_type, make_runtime):
    """An argv exec runs in the given folder of the workspace, with the spec's and the call's
    variables, and reads the given stdin. Its podman case (acceptance) takes about 2 s here."""
    runtime = await make_runtime(runtime_type, env={"FROM_SPEC": "spec"})
    await runtime.exec(["mkdir", "sub"])
    result = await runtime.exec(
        ["sh", "-c", 'pwd; echo "$FROM_SPEC $FROM_CALL"; cat'],
        env={"FROM_CALL": "call"},
        cwd="sub",
        stdin=b"from stdin",
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [f"{runtime.workdir}/sub", "spec call", "from stdin"]


async def test_environment_is_not_inherited(runtime_type, make_runtime, monkeypatch):
    """A variable of the worker's environment does not reach the runtime; HOME is the runtime's
    home and ROLLOUTD_RUNTIME_ID its id. Its podman case (acceptance) takes about 1 s here."""
    monkeypatch.setenv("ROLLOUTD_TEST_SECRET", "do-not-leak")
    runtime = await make_runtime(runtime_type)
    result = await runtime.exec("env")
    assert "do-not-leak" not in result.stdout
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert env["HOME"] == runtime.home
    assert env["ROLLOUTD_RUNTIME_ID"] == runtime.runtime_id


async def test_home_is_private_and_writable(runtime_type, make_runtime):
    """A file written to $HOME inside reads back through download and in the host's folder of
    that home. Its podman case (acceptance) takes about 1 s here."""
    runtime = await make_runtime(runtime_type)
    result = await runtime.exec('echo cfg > "$HOME/config" && cat "$HOME/config"')
    assert result.stdout == "cfg\n"
    assert await runtime.download(f"{runtime.home}/config") == b"cfg\n"
    assert (runtime.host_home / "config").read_text() == "cfg\n"


async def test_exec_timeout_kills_and_reports(runtime_type, make_runtime, runtime_pids):
    """An exec past its timeout is reported timed out with a nonzero exit within 5 s, and its
    whole process tree is gone. Its podman case (acceptance) takes about 2 s here."""
    runtime = await make_runtime(runtime_type)
    began = time.monotonic()
    result = await runtime.exec(TREE, timeout_s=0.5)
    assert result.timed_out
    assert result.exit_code != 0
    assert time.monotonic() - began < 5.0
    assert runtime_pids(runtime) == []


async def test_exec_output_is_bounded(runtime_type, make_runtime):
    """Output past max_output_bytes is cut in the middle: head and tail kept, a note of the
    bytes cut, the result marked truncated. Its podman case (acceptance) takes about 1 s here."""
    runtime = await make_runtime(runtime_type)
    result = await runtime.exec(
        "head -c 200000 /dev/zero | tr '\\0' a; echo END", max_output_bytes=1000
    )
    assert result.exit_code == 0
    assert result.truncated
    assert result.stdout.startswith("a" * 500)
    assert result.stdout.endswith("END\n")
    assert "bytes truncated" in result.stdout
    assert len(result.stdout) < 1100


async def test_missing_program_is_a_nonzero_exit(runtime_type, make_runtime):
    """A program that does not exist is a nonzero exit naming it on stderr, not an error of the
    runtime. Its podman case (acceptance) takes about 1 s here."""
    runtime = await make_runtime(runtime_type)
    result = await runtime.exec(["no-such-program-rolloutd"])
    assert result.exit_code != 0
    assert "no-such-program-rolloutd" in result.stderr


async def test_upload_download_round_trip(runtime_type, make_runtime):
    """Upload and download by relative and absolute workspace paths, binary data intact; a
    missing file is NotFoundError. Its podman case (acceptance) takes about 2 s here."""
    runtime = await make_runtime(runtime_type)
    await runtime.upload("dir/data.bin", b"\x00\x01binary")
    await runtime.upload(f"{runtime.workdir}/abs.txt", b"absolute")
    result = await runtime.exec("cat abs.txt; echo; wc -c < dir/data.bin")
    assert result.stdout.split() == ["absolute", "8"]
    await runtime.exec("echo made-inside > out.txt")
    assert await runtime.download("out.txt") == b"made-inside\n"
    assert await runtime.download(f"{runtime.workdir}/out.txt") == b"made-inside\n"
    with pytest.raises(NotFoundError):
        await runtime.download("missing.txt")


@pytest.mark.parametrize(
    "path", ["../escape.txt", "a/../../escape.txt", "/etc/passwd", "/workspacex/file"]
)
async def test_paths_cannot_escape(runtime_type, make_runtime, path):
    """Upload and download refuse (ConfigError) paths out of the workspace: ``..``, absolute
    paths elsewhere, a sibling folder sharing the prefix. Its podman case (acceptance) takes
    about 2 s here per path."""
    runtime = await make_runtime(runtime_type)
    if path == "/workspacex/file":
        path = runtime.workdir + "x/file"
    with pytest.raises(ConfigError):
        await runtime.download(path)
    with pytest.raises(ConfigError):
        await runtime.upload(path, b"x")


async def test_links_out_are_refused_or_replaced(runtime_type, make_runtime):
    """Links the runtime's processes made are never followed by the worker: a download through
    one is refused (PathRefusedError), an upload through a linked folder too, and an upload to
    a link replaces the link with the file. Its podman case (acceptance) takes about 2 s."""
    runtime = await make_runtime(runtime_type)
    await runtime.exec("ln -s /etc link && ln -s /etc/passwd passwd-link && mkfifo fifo")
    passwd = Path("/etc/passwd").read_bytes()
    for path in ("link/passwd", "passwd-link", "fifo"):
        with pytest.raises(PathRefusedError):
            await runtime.download(path)
    with pytest.raises(PathRefusedError):
        await runtime.upload("link/passwd", b"x")
    await runtime.upload("passwd-link", b"mine")
    assert (await runtime.exec("cat passwd-link; test -L passwd-link || echo -file")).stdout == (
        "mine-file\n"
    )
    assert Path("/etc/passwd").read_bytes() == passwd


async def test_spawn_writes_logs_and_waits(runtime_type, make_runtime, tmp_path):
    """A spawned process writes stdout and stderr to their files; wait returns its exit code.
    Its podman case (acceptance) takes about 2 s here."""
    runtime = await make_runtime(runtime_type)
    process = await runtime.spawn("echo out; echo err >&2; exit 7", stdout_path=tmp_path / "h.out")
    assert await process.wait(30) == 7
    assert process.returncode == 7
    assert (tmp_path / "h.out").read_text() == "out\n"
    assert process.stderr_path is not None and process.stderr_path.read_text() == "err\n"


async def test_wait_returns_none_on_timeout(runtime_type, make_runtime):
    """wait returns None while the process still runs; terminate ends it and sets its code. Its
    podman case (acceptance) takes about 2 s here."""
    runtime = await make_runtime(runtime_type)
    process = await runtime.spawn("sleep 1000")
    assert await process.wait(0.2) is None
    assert process.returncode is None
    await process.terminate()
    assert process.returncode is not None


async def test_stop_kills_a_process_tree(runtime_type, make_runtime, runtime_pids, wait_for):
    """stop kills every process of a spawned tree and removes the runtime's folder; a second
    stop does nothing. Its podman case (acceptance) takes about 3 s here."""
    runtime = await make_runtime(runtime_type)
    await runtime.spawn(TREE)
    # sh and two sleeps (plus bwrap's outer process and init): wait until all are up
    # (the count is taken once: a second /proc scan may run while a process is mid-fork)
    assert await wait_for(lambda: len(runtime_pids(runtime)) >= 3)
    await runtime.stop()
    assert runtime_pids(runtime) == []
    assert not runtime.runtime_dir.exists()
    await runtime.stop()  # idempotent


async def test_cancel_kills_processes_and_keeps_files(
    runtime_type, make_runtime, runtime_pids, wait_for
):
    """cancel kills the processes of two spawned trees but keeps the workspace: its files still
    download and exec still runs. Its podman case (acceptance) takes about 2 s here."""
    runtime = await make_runtime(runtime_type)
    await runtime.exec("echo kept > kept.txt")
    first = await runtime.spawn(TREE)
    second = await runtime.spawn(TREE, name="other")
    assert await wait_for(lambda: len(runtime_pids(runtime)) >= 6)
    await runtime.cancel()
    assert runtime_pids(runtime) == []
    assert first.returncode is not None and second.returncode is not None
    assert await runtime.download("kept.txt") == b"kept\n"
    assert (await runtime.exec("cat kept.txt")).stdout == "kept\n"


async def test_cancel_kills_what_a_harness_left_behind(runtime_type, make_runtime, runtime_pids):
    """The end of a run (cancel) kills a daemon the harness left outside its process group,
    also after the harness killed its own shim where it can (bwrap and podman: it shares the
    shims' uid here only under a worker that is not root, or in a container). Its podman case
    (acceptance) takes about 3 s here."""
    runtime = await make_runtime(runtime_type)
    # local: the harness's parent is the worker itself, never to be signalled
    kill_shim = "kill -KILL $PPID 2> /dev/null; " if runtime_type != "local" else ""
    harness = await runtime.spawn(
        f"setsid sleep 1000 > /dev/null 2>&1 < /dev/null & {kill_shim}sleep 0.5; exit 3"
    )
    assert await harness.wait(30) == 3
    await runtime.cancel()
    assert runtime_pids(runtime) == []
    assert (await runtime.exec("echo on")).stdout == "on\n"


async def test_background_child_of_exec_is_killed_at_stop(runtime_type, make_runtime, runtime_pids):
    """A background child an exec left running is killed at stop. Its podman case (acceptance)
    takes about 2 s here."""
    runtime = await make_runtime(runtime_type)
    result = await runtime.exec("sleep 1000 > /dev/null 2>&1 & echo started")
    assert result.stdout == "started\n"
    await runtime.stop()
    assert runtime_pids(runtime) == []


async def _wait_ready(process, wait_for) -> None:
    """Wait until the process printed ``ready`` (its signal handling is set up)."""
    assert await wait_for(lambda: "ready" in process.stdout_path.read_text())


async def test_terminate_is_graceful_when_sigterm_is_handled(runtime_type, make_runtime, wait_for):
    """terminate sends SIGTERM first: a harness that handles it exits with its own code and
    output, within 5 s. Its podman case (acceptance) takes about 1 s here."""
    runtime = await make_runtime(runtime_type, grace_s=10.0)
    process = await runtime.spawn(
        "trap 'echo bye; exit 5' TERM; echo ready; while true; do sleep 0.05; done"
    )
    await _wait_ready(process, wait_for)
    began = time.monotonic()
    code = await process.terminate()
    assert code == 5
    assert time.monotonic() - began < 5.0
    assert process.stdout_path.read_text() == "ready\nbye\n"


async def test_harness_ignoring_sigterm_is_killed(
    runtime_type, make_runtime, runtime_pids, wait_for
):
    """A harness ignoring SIGTERM is SIGKILLed after the grace period (exit -9 or 137), and none
    of its processes is left. Its podman case (acceptance) takes about 2 s here."""
    runtime = await make_runtime(runtime_type, grace_s=0.5)
    process = await runtime.spawn("trap '' TERM; echo ready; sleep 1000 & wait")
    await _wait_ready(process, wait_for)
    began = time.monotonic()
    code = await process.terminate()
    elapsed = time.monotonic() - began
    # SIGKILL after the grace period: -9, or 128 + 9 when bwrap reports its command killed
    assert code in (-9, 137)
    assert 0.5 <= elapsed < 10.0
    assert runtime_pids(runtime) == []


async def test_memory_limit(runtime_type, make_runtime):
    """A 1 GiB allocation fails under memory_mb=256 and succeeds without a limit. Its podman
    case (acceptance) takes about 9 s here."""
    limited = await make_runtime(runtime_type, memory_mb=256)
    grab = "python3 -c 'b = bytearray(1024 * 2**20); print(len(b))'"
    assert (await limited.exec(grab)).exit_code != 0
    unlimited = await make_runtime(runtime_type)
    assert (await unlimited.exec(grab)).exit_code == 0


async def test_runtime_refuses_use_before_start_and_after_stop(runtime_type, tmp_path):
    """exec before start and after stop, and a second start, raise RolloutdError. Its podman
    case (acceptance) takes about 1 s here."""
    runtime = create_runtime(RuntimeSpec(type=runtime_type), "not-started", tmp_path)
    with pytest.raises(RolloutdError):
        await runtime.exec("true")
    await runtime.start()
    await runtime.stop()
    with pytest.raises(RolloutdError):
        await runtime.exec("true")
    with pytest.raises(RolloutdError):
        await runtime.start()


def test_create_runtime_refuses_unbuilt_and_bad_specs(tmp_path: Path):
    # apptainer needs an image; podman and docker fall back to the host's base image
    with pytest.raises(ConfigError, match="image"):
        create_runtime(RuntimeSpec(type="apptainer"), "x", tmp_path)
    with pytest.raises(ConfigError, match="gateway"):  # local isolates nothing
        create_runtime(RuntimeSpec(type="local", network="gateway"), "x", tmp_path)
    with pytest.raises(ConfigError, match="runtime_id"):
        create_runtime(RuntimeSpec(type="local"), "task/0", tmp_path)
    with pytest.raises(ValidationError, match="workdir"):
        RuntimeSpec(type="bwrap", workdir="relative")
    with pytest.raises(ConfigError):
        create_runtime(RuntimeSpec(type="bwrap", workdir="/tmp"), "x", tmp_path)
