"""What rolloutd.sandbox.snapshot reads of a running container, with real podman."""

from __future__ import annotations

import shutil

import pytest

from rolloutd.errors import ConfigError
from rolloutd.sandbox import snapshot

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
]


async def test_changes_and_disk_use_of_a_podman_container(make_runtime):
    """A file the container wrote outside its mounts is listed as written, one it removed as
    deleted, none of the runtime's own mounts; the bytes written count both its layer and
    the workspace. About 30 s with the base image built (podman diff and inspect)."""
    runtime = await make_runtime("podman")
    before = await snapshot.disk_used_bytes(runtime)
    result = await runtime.exec(
        "head -c 100000 /dev/zero > /opt/made.bin && rm /etc/issue && echo hi > in-workspace.txt"
    )
    assert result.exit_code == 0, result.stderr
    found = await snapshot.changes(runtime)
    assert "/opt/made.bin" in found.added and "/opt/made.bin" in found.written
    assert "/etc/issue" in found.deleted
    assert not [p for p in found.written if p.startswith((runtime.workdir, runtime.home, "/run"))]
    assert await snapshot.disk_used_bytes(runtime) >= before + 100_000


async def test_changes_refuses_a_runtime_that_is_not_a_container(make_runtime):
    """A bwrap or local runtime has no container to diff: ConfigError before any CLI runs
    (under 1 s)."""
    runtime = await make_runtime("local")
    with pytest.raises(ConfigError, match="container runtime"):
        await snapshot.changes(runtime)
