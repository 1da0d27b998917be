"""A session's final state: stored host-side from a runtime's workspace (links kept as links,
never followed; FIFOs skipped; a named file reached through a link is missing), bounded
(over the bound refused whole, never cut), and restored into a fresh runtime of the same spec,
where a check sees what the agent left."""

from __future__ import annotations

import io
import os
import shutil
import tarfile

import pytest

from rolloutd.final_state import FinalState, FinalStateParts
from rolloutd.sandbox.final_state import (
    _restore_filter,
    pack_workspace,
    restore_final_state,
    store_final_state,
)
from rolloutd.store import BlobStore, final_state_key
from rolloutd.types import EvaluatorSpec

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

SPEC = EvaluatorSpec(type="test_on_output", command="grep -q 42 answer.txt")


def _members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_links_are_stored_as_links_and_never_followed(tmp_path):
    workspace = tmp_path / "ws"
    (workspace / "pkg").mkdir(parents=True)
    (workspace / "pkg" / "a.py").write_text("x = 1\n")
    (workspace / "out").symlink_to("/etc")  # a folder link: never descended into
    (workspace / "secret").symlink_to("/etc/hostname")
    os.mkfifo(workspace / "pipe")
    out = io.BytesIO()
    num_entries, num_skipped, missing = pack_workspace(workspace, out)
    members = _members(out.getvalue())
    assert set(members) == {"pkg", "pkg/a.py", "out", "secret"}
    assert members["out"].issym() and members["out"].linkname == "/etc"
    assert members["secret"].issym() and members["secret"].size == 0
    assert (num_entries, num_skipped, missing) == (4, 1, [])


def test_named_files_through_a_link_are_missing(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "solution.py").write_text("def f(): pass\n")
    (workspace / "via").symlink_to("/etc")
    (workspace / "answer.txt").symlink_to("/etc/hostname")
    out = io.BytesIO()
    _, _, missing = pack_workspace(
        workspace, out, files=["solution.py", "via/hostname", "answer.txt", "none.txt"]
    )
    assert set(_members(out.getvalue())) == {"solution.py"}
    assert missing == ["via/hostname", "answer.txt", "none.txt"]


def test_restore_refuses_names_outside_and_devices(tmp_path):
    outside = tarfile.TarInfo("../escape")
    device = tarfile.TarInfo("dev")
    device.type = tarfile.CHRTYPE
    setuid = tarfile.TarInfo("run")
    setuid.mode = 0o4755
    with pytest.raises(tarfile.OutsideDestinationError):
        _restore_filter(outside, str(tmp_path))
    assert _restore_filter(device, str(tmp_path)) is None
    kept = _restore_filter(setuid, str(tmp_path))
    assert kept is not None and kept.mode == 0o755


async def test_workdir_round_trip_into_a_fresh_runtime(make_runtime, tmp_path):
    """The agent deleted a task file, wrote an answer and a link; the fresh runtime (the same
    spec, its task file written again) holds exactly what the agent left, and the check
    passes there as it did in the session."""
    store = BlobStore(str(tmp_path / "store"))
    files = {"task.txt": "the task\n"}
    agent = await make_runtime("bwrap", files=files)
    ran = await agent.exec("rm task.txt && echo 42 > answer.txt && ln -s answer.txt latest")
    assert ran.exit_code == 0
    state = await store_final_state(
        agent, store, session_id="t/0", evaluator=SPEC, parts=FinalStateParts(), max_bytes=1 << 20
    )
    assert state.stored and state.workdir is not None and state.workdir.num_entries == 2
    assert store.get_model(final_state_key("t/0"), FinalState) == state
    assert not (agent.runtime_dir / "final-state").exists()  # the staging file is gone

    fresh = await make_runtime("bwrap", files=files)
    await restore_final_state(fresh, store, state)
    listing = await fresh.exec("ls; readlink latest; grep -q 42 answer.txt")
    assert listing.exit_code == 0, listing.stderr
    assert listing.stdout.split() == ["answer.txt", "latest", "answer.txt"]


async def test_files_part_keeps_only_the_answer(make_runtime, tmp_path):
    store = BlobStore(str(tmp_path / "store"))
    agent = await make_runtime("bwrap")
    await agent.exec("echo 'def f(): return 1' > solution.py && echo noise > other.txt")
    parts = FinalStateParts(kind="files", files=["solution.py"])
    state = await store_final_state(
        agent, store, session_id="t/1", evaluator=SPEC, parts=parts, max_bytes=1 << 20
    )
    fresh = await make_runtime("bwrap", files={"given.txt": "kept\n"})
    await restore_final_state(fresh, store, state)
    listing = await fresh.exec("ls")
    assert listing.stdout.split() == ["given.txt", "solution.py"]


async def test_a_state_over_the_bound_is_refused_whole(make_runtime, tmp_path):
    store = BlobStore(str(tmp_path / "store"))
    agent = await make_runtime("bwrap")
    await agent.exec("head -c 200000 /dev/zero > big.bin && echo 42 > answer.txt")
    state = await store_final_state(
        agent, store, session_id="t/2", evaluator=SPEC, parts=FinalStateParts(), max_bytes=65536
    )
    assert not state.stored and state.workdir is None and state.num_bytes == 0
    assert "max_final_state_bytes = 65536" in (state.refused or "")
    assert not store.exists(final_state_key("t/2", "workdir.tar"))
    with pytest.raises(Exception, match="no final state to restore"):
        await restore_final_state(agent, store, state)


@pytest.mark.acceptance
@pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman")
async def test_system_changes_round_trip_on_podman(make_runtime, tmp_path):
    """A podman session adds a program first on PATH, replaces ``tar`` with one that writes
    nothing, deletes a file, hands a file to uid 1000 and writes its workspace: the state is
    read host-side (the session's ``tar`` takes no part), and a fresh container of the same
    spec, restored, holds the same files, modes and owners, and its own diff lists the same
    changed paths as the session's."""
    from rolloutd.sandbox.runtimes.podman_images import ensure_base_image
    from rolloutd.sandbox.snapshot import changes

    await ensure_base_image()
    store = BlobStore(str(tmp_path / "store"))
    spec = {"network": "none", "workdir": "/app"}
    agent = await make_runtime("podman", runtime_id="fs-agent", **spec)
    ran = await agent.exec(
        "printf '#!/bin/sh\\necho 1\\n' > /usr/local/bin/python3 && chmod 755 "
        "/usr/local/bin/python3 && mkdir -p /opt/data && echo owned > /opt/data/f && "
        "chown 1000:1000 /opt/data/f && rm /etc/motd && echo 42 > answer.txt && "
        "printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/tar && chmod 755 /usr/local/bin/tar"
    )
    assert ran.exit_code == 0, ran.stderr
    before = await changes(agent)
    state = await store_final_state(
        agent, store, session_id="p/0", evaluator=SPEC, parts=FinalStateParts(), max_bytes=1 << 24
    )
    assert state.stored and state.system is not None and state.system.pack is not None
    assert state.image_digest and state.system.deleted == ["/etc/motd"]
    assert "/usr/local/bin/python3" in state.system.added and state.system.num_skipped == 0

    fresh = await make_runtime("podman", runtime_id="fs-fresh", **spec)
    await restore_final_state(fresh, store, state)
    after = await changes(fresh)
    assert after.leaves() == before.leaves()
    shown = await fresh.exec(
        "stat -c '%a %u:%g %n' /usr/local/bin/python3 /opt/data/f; cat /opt/data/f answer.txt;"
        " test ! -e /etc/motd && echo gone"
    )
    assert shown.stdout.split("\n")[:5] == [
        "755 0:0 /usr/local/bin/python3",
        "644 1000:1000 /opt/data/f",
        "owned",
        "42",
        "gone",
    ], shown.stdout
