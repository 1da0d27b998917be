"""200 sessions in a row through the sandbox activities leave nothing behind: processes,
mounts, cgroups, folders and file descriptors are counted before and after, not assumed."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from rolloutd.activities.models import (
    CollectArtifactsInput,
    OpenSessionOutput,
    ProvisionRuntimeInput,
    RunHarnessInput,
    TeardownRuntimeInput,
)
from rolloutd.activities.sandbox import SandboxActivities
from rolloutd.settings import SandboxSettings
from rolloutd.store import BlobStore
from rolloutd.types import EvaluatorSpec, HarnessSpec, RuntimeSpec

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

NUM_SESSIONS = 200
#: the harness calls its session through the relay and writes what it got into the workspace.
HARNESS = (
    'python3 -c "import os, urllib.request; '
    "open('reply.txt', 'wb').write(urllib.request.urlopen("
    "os.environ['OPENAI_BASE_URL'] + '/models', timeout=5).read())\""
)


def mount_counts() -> tuple[int, int]:
    """Lines of this process's and of pid 1's mountinfo."""
    own = Path("/proc/self/mountinfo").read_text().count("\n")
    init = Path("/proc/1/mountinfo").read_text().count("\n")
    return own, init


def rolloutd_processes() -> list[int]:
    """Live processes carrying a runtime id in their environment (every sandboxed command)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"ROLLOUTD_RUNTIME_ID=leak-" in environ or b"/leak-" in cmdline:
            pids.append(int(entry))
    return pids


def cgroup_dirs() -> int:
    root = Path("/sys/fs/cgroup/pids/rolloutd")
    return sum(1 for p in root.iterdir() if p.is_dir()) if root.exists() else 0


async def test_200_sessions_leave_no_process_mount_cgroup_or_folder(tmp_path):
    seen: list[bytes] = []

    async def gateway(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b"\r\n", 1)[0])
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"data":[]}')
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(gateway, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = SandboxSettings(
        host_id="leak-host",
        runtime_root=str(tmp_path / "runtimes"),
        store_url=str(tmp_path / "store"),
        log_json=False,
    )
    acts = SandboxActivities(settings, BlobStore(settings.store_url))
    env = ActivityEnvironment()
    spec = RuntimeSpec(type="bwrap", max_processes=64, files={"a.txt": "x"})
    before = (mount_counts(), cgroup_dirs(), len(os.listdir("/proc/self/fd")))
    assert rolloutd_processes() == []
    try:
        for i in range(NUM_SESSIONS):
            session_id = f"leak-{i}"
            key = f"key{i}"
            session = OpenSessionOutput(
                session_id=session_id,
                session_key=key,
                openai_base_url=f"http://127.0.0.1:{port}/s/{key}/v1",
                anthropic_base_url=f"http://127.0.0.1:{port}/s/{key}",
                gemini_base_url=f"http://127.0.0.1:{port}/s/{key}",
                model="m",
                backend="b",
                host_queue="q",
            )
            provisioned = await env.run(
                acts.provision_runtime, ProvisionRuntimeInput(session_id=session_id, runtime=spec)
            )
            ran = await env.run(
                acts.run_harness,
                RunHarnessInput(
                    runtime_id=provisioned.runtime_id,
                    session_id=session_id,
                    harness=HarnessSpec(type="shell", command=HARNESS),
                    instruction="x",
                    session=session,
                    timeout_s=60,
                ),
            )
            assert ran.exit_code == 0, ran.stderr_tail
            collected = await env.run(
                acts.collect_artifacts,
                CollectArtifactsInput(
                    runtime_id=provisioned.runtime_id,
                    session_id=session_id,
                    evaluator=EvaluatorSpec(
                        type="test_on_output", command="cat reply.txt", expected_output="data"
                    ),
                ),
            )
            assert "check" in collected.artifacts
            await env.run(
                acts.teardown_runtime, TeardownRuntimeInput(runtime_id=provisioned.runtime_id)
            )
    finally:
        await acts.stop_all()
        server.close()
        await server.wait_closed()
    # a harness running past one heartbeat also asks the gateway's verdict on its session
    calls = [line for line in seen if b"/rolloutd/verdict " not in line]
    assert len(calls) == NUM_SESSIONS
    assert all(line == f"GET /s/key{i}/v1/models HTTP/1.1".encode() for i, line in enumerate(calls))
    after = (mount_counts(), cgroup_dirs(), len(os.listdir("/proc/self/fd")))
    assert rolloutd_processes() == []
    # mounts (own, pid 1) and cgroup folders: a leak adds one; other processes on the machine
    # (a podman build) may remove one of theirs meanwhile, so fewer is not a leak
    assert after[0][0] <= before[0][0] and after[0][1] <= before[0][1], (before, after)
    assert after[1] <= before[1], (before, after)
    assert after[2] <= before[2], (before, after)  # no file descriptor leaked (netns fds)
    # the runtime root keeps only its ownership bookkeeping folder, with no owner left in it
    root = tmp_path / "runtimes"
    assert [p.name for p in root.iterdir() if p.name != ".owners"] == []
    assert not (root / ".owners").exists() or list((root / ".owners").iterdir()) == []
