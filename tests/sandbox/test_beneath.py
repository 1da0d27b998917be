"""The worker's file operations in a runtime's folders never follow a link out of them: against
links left in place, and against another process swapping a folder and a file for links to a
host folder outside while the operations run (the time-of-check to time-of-use race a resolve,
check, then open invites; the control shows that race is real here)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rolloutd.errors import ArtifactTooLargeError, NotFoundError, PathRefusedError
from rolloutd.sandbox.runtimes import beneath

#: flips ``root/d`` between a folder and a link to ``outside`` and ``root/d/f`` between a file
#: and a link to ``outside/secret``, each flip one atomic rename(2), until killed
SWAPPER = r"""
import os, sys
root, outside = sys.argv[1], sys.argv[2]
real, d = f"{root}/real", f"{root}/d"
os.makedirs(real, exist_ok=True)
with open(f"{real}/f", "w") as f:
    f.write("inside")
n = 0
while True:
    try:
        os.rename(real, d)                          # d: the folder
        os.symlink(f"{outside}/secret", f"{d}/l")
        os.rename(f"{d}/l", f"{d}/f")               # d/f: a link out
        with open(f"{d}/p", "w") as f:
            f.write("inside")
        os.rename(f"{d}/p", f"{d}/f")               # d/f: a file
        os.rename(d, real)
        os.symlink(outside, d)                      # d: a link out
        os.unlink(d)
    except OSError:  # the worker made d (a write makes missing folders): move it away
        n += 1
        try:
            os.rename(d, f"{root}/made{n}")
        except OSError:
            pass
"""


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A runtime root and a host folder outside it holding a secret."""
    root, outside = tmp_path / "workspace", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("host secret")
    return root, outside


def test_links_left_in_place_are_refused_or_replaced(tree):
    root, outside = tree
    (root / "d").symlink_to(outside)
    (root / "f").symlink_to(outside / "secret")
    (root / "fifo").parent.mkdir(exist_ok=True)
    os.mkfifo(root / "fifo")
    with pytest.raises(PathRefusedError, match="'d' is a symbolic link"):
        beneath.read_file(root, ("d", "secret"), label="d/secret", max_bytes=100)
    with pytest.raises(PathRefusedError, match="'f'"):
        beneath.read_file(root, ("f",), label="f", max_bytes=100)
    with pytest.raises(PathRefusedError, match="not a regular file"):  # never blocks
        beneath.read_file(root, ("fifo",), label="fifo", max_bytes=100)
    with pytest.raises(PathRefusedError):
        beneath.write_file(root, ("d", "secret"), b"x", label="d/secret")
    # a link at the end is replaced by the new file, not written through
    beneath.write_file(root, ("f",), b"mine", label="f")
    assert not (root / "f").is_symlink() and (root / "f").read_bytes() == b"mine"
    assert (outside / "secret").read_text() == "host secret"
    with pytest.raises(NotFoundError):
        beneath.read_file(root, ("missing",), label="missing", max_bytes=100)
    (root / "big").write_bytes(b"x" * 101)
    with pytest.raises(ArtifactTooLargeError, match="101 bytes"):
        beneath.read_file(root, ("big",), label="big", max_bytes=100)


@pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")
def test_ownership_changes_do_not_cross_a_link(tree):
    root, outside = tree
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_text("x")
    (root / "a" / "out").symlink_to(outside)
    beneath.chown_tree(root, ("a",), (60001, 60001), label="a")
    assert (root / "a" / "b" / "f").stat().st_uid == 60001
    assert (root / "a" / "out").lstat().st_uid == 60001  # the link itself
    assert (outside / "secret").stat().st_uid == 0 and outside.stat().st_uid == 0
    (root / "x").symlink_to(outside)
    with pytest.raises(PathRefusedError):
        beneath.chown_tree(root, ("x", "secret"), (60001, 60001), label="x/secret")
    assert (outside / "secret").stat().st_uid == 0


def test_copies_keep_links_as_links_and_refuse_one_in_the_target(tree, tmp_path):
    root, outside = tree
    source = tmp_path / "source"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("x = 1\n")
    (source / "pkg" / "up").symlink_to(outside)
    src = os.open(source, beneath.READ_DIR_FLAGS)
    dst = os.open(root, beneath.READ_DIR_FLAGS)
    try:
        assert beneath.copy_tree(src, dst, label="repo") == 6
        assert (root / "pkg" / "mod.py").read_text() == "x = 1\n"
        assert os.readlink(root / "pkg" / "up") == str(outside)
        (root / "pkg").rename(root / "pkg.real")
        (root / "pkg").symlink_to(outside)  # a folder of the copy is now a link out
        with pytest.raises(PathRefusedError):
            beneath.copy_tree(src, dst, label="repo")
    finally:
        os.close(src)
        os.close(dst)
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


def _naive_read(root: Path, rel: str) -> bytes:
    """Resolve, check, then open: the shape the worker's reads had."""
    host = (root / rel).resolve()
    if not host.is_relative_to(root.resolve()):
        raise PermissionError(rel)
    return host.read_bytes()


def _race(
    root: Path, outside: Path, attempt, num_tries: int, *, until_outside: bool = False
) -> dict[str, int]:
    """Run ``attempt()`` ``num_tries`` times while the swapper runs (with ``until_outside``:
    until it first reaches outside); count the outcomes."""
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(root), str(outside)])
    counts = {"inside": 0, "outside": 0, "refused": 0}
    try:
        deadline = time.monotonic() + 10
        while not (root / "real").exists() and not (root / "d").exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for _ in range(num_tries):
            try:
                counts[attempt()] += 1
            except (PathRefusedError, NotFoundError, PermissionError, OSError):
                counts["refused"] += 1
            if until_outside and counts["outside"]:
                break
        assert swapper.poll() is None, "the swapper stopped: the race did not run"
    finally:
        swapper.kill()
        swapper.wait()
    for child in root.iterdir():  # the next race starts from an empty root
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    return counts


def test_reads_and_writes_beneath_a_racing_swapper_stay_inside(tree):
    """About 1 s: thousands of reads and writes of ``d/f`` while another process flips ``d``
    and ``d/f`` between the real thing and links to a host folder outside: no read returns the
    host file, no write reaches it, every attempt reads or writes inside or is refused. The
    control: the resolve-check-open shape is fooled into reading the host file."""
    root, outside = tree

    def read() -> str:
        data = beneath.read_file(root, ("d", "f"), label="d/f", max_bytes=100)
        return "outside" if data == b"host secret" else "inside"

    def write() -> str:
        beneath.write_file(root, ("d", "f"), b"worker", label="d/f")
        return "inside"

    reads = _race(root, outside, read, 10_000)
    writes = _race(root, outside, write, 10_000)
    assert reads["outside"] == 0 and reads["inside"] > 0, reads
    assert writes["inside"] > 0, writes
    assert (outside / "secret").read_text() == "host secret"
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]

    def naive() -> str:
        return "outside" if _naive_read(root, "d/f") == b"host secret" else "inside"

    control = _race(root, outside, naive, 50_000, until_outside=True)
    assert control["outside"] > 0, control  # the race the walk closes is real here
