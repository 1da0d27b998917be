"""bwrap's seccomp filter: inside a sandbox, a new user namespace (``unshare -U``, a ``clone``
with ``CLONE_NEWUSER``), the kernel's keyring (``keyctl``) and ``bpf`` are denied with EPERM,
while ordinary work (a shell, a subprocess, node's child_process) runs. The control: the same
probes as the same unprivileged uid on the host, outside any sandbox, succeed, so what denies
them inside is the filter, not a missing capability. Default tier: a few seconds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rolloutd.sandbox.runtimes import create_runtime
from rolloutd.sandbox.runtimes.bwrap import can_run_as_sandbox_user
from rolloutd.types import RuntimeSpec

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap"),
]

#: each probe makes one system call and prints its errno name ("ok" when it succeeded)
PROBES = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
SIGCHLD, CLONE_NEWUSER = 17, 0x10000000
def call(number, *args):
    result = libc.syscall(number, *[ctypes.c_long(a) for a in args])
    if result < 0:
        return errno.errorcode[ctypes.get_errno()]
    if number == 56 and result == 0:  # the clone's child
        os._exit(0)
    if number == 56:
        os.waitpid(result, 0)
    return "ok"
print(json.dumps({
    # x86-64 numbers (asm/unistd_64.h)
    "unshare_user": call(272, CLONE_NEWUSER),
    "clone_user": call(56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0),
    "keyctl": call(250, 0, -3, 0, 0, 0),  # KEYCTL_GET_KEYRING_ID of the session keyring
    "bpf": call(321, 0, 0, 0),  # BPF_MAP_CREATE without attributes: EFAULT when allowed
    "fork": call(56, SIGCHLD, 0, 0, 0, 0),
}))
"""

needs_x86_64 = pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 numbers")


@needs_x86_64
async def test_namespaces_keyring_and_bpf_are_denied_inside_and_work_outside(
    tmp_path: Path,
) -> None:
    runtime = create_runtime(RuntimeSpec(type="bwrap"), "seccomp1", tmp_path / "rt")
    await runtime.start()
    try:
        inside = await runtime.exec([sys.executable, "-I", "-c", PROBES])
        assert inside.exit_code == 0, inside.stderr
        denied = json.loads(inside.stdout)
        assert denied == {
            "unshare_user": "EPERM",
            "clone_user": "EPERM",
            "keyctl": "EPERM",
            "bpf": "EPERM",
            "fork": "ok",
        }, denied
        shell = await runtime.exec("unshare -U true; echo unshare=$?; echo control-ok")
        assert "unshare=1" in shell.stdout and "control-ok" in shell.stdout, shell
        assert "Operation not permitted" in shell.stderr, shell.stderr
        spawned = await runtime.exec(
            [sys.executable, "-I", "-c", "import subprocess; subprocess.run(['true'], check=True)"]
        )
        assert spawned.exit_code == 0, spawned.stderr  # posix_spawn: clone3 falls back to clone
        if shutil.which("node"):
            node = await runtime.exec(
                ["node", "-e", "process.stdout.write(require('child_process').execSync('echo n'))"]
            )
            assert node.exit_code == 0 and node.stdout.strip() == "n", node
    finally:
        sandbox_uid = runtime.uid
        await runtime.stop()

    # the control: the same uid outside any sandbox may make each of these calls
    uid = sandbox_uid if can_run_as_sandbox_user() else os.getuid()
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    outside = subprocess.run(
        [*setpriv, sys.executable, "-I", "-c", PROBES]
        if uid != os.getuid()
        else [sys.executable, "-I", "-c", PROBES],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    allowed = json.loads(outside.stdout)
    # (a raw clone of a user namespace from Python fails outside too here: not a control)
    assert allowed["unshare_user"] == "ok" and allowed["keyctl"] == "ok", allowed
    assert allowed["bpf"] == "EINVAL", allowed  # reached the kernel's argument checks


@needs_x86_64
async def test_a_sandbox_running_as_the_workers_uid_disables_user_namespaces(
    tmp_path: Path,
) -> None:
    """Commands as the worker's own uid (a worker that cannot switch uids): bwrap also gets
    ``--unshare-user --disable-userns``; the sandbox works and no user namespace is made."""
    runtime = create_runtime(RuntimeSpec(type="bwrap"), "seccomp2", tmp_path / "rt")
    runtime.uid = runtime.gid = -1
    assert "--disable-userns" in runtime.bwrap_args("/workspace")
    await runtime.start()
    try:
        result = await runtime.exec([sys.executable, "-I", "-c", PROBES])
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["unshare_user"] in ("EPERM", "ENOSPC"), result.stdout
        assert (await runtime.exec("echo ok")).stdout == "ok\n"
    finally:
        await runtime.stop()
