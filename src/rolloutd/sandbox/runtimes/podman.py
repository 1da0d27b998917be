"""The ``podman`` runtime (and ``docker``, the same code with another binary): one OCI container
per runtime, from an image per task, with bwrap's exec server as the container's pid 1.

Start (:meth:`PodmanRuntime.start`):

1. the image: ``spec.build`` is built from its Dockerfile (cached by content hash,
   :mod:`~rolloutd.sandbox.runtimes.podman_images`), ``spec.image`` is used as named, and with
   neither the Debian base image made on the host (:data:`~.podman_images.BASE_IMAGE`);
2. the workspace (``{runtime_dir}/workspace``, bound at ``spec.workdir``) is seeded with what the
   image holds there (a task image's repository), without overwriting ``spec.files``;
3. the worker listens on a ``SOCK_SEQPACKET`` unix socket in the runtime's ``net`` folder and
   runs ``podman run --detach --rm`` with the exec server
   (:mod:`~rolloutd.sandbox.runtimes.exec_server_inside`) as the container's command. The exec
   server is the worker's own Python, started by the host's dynamic loader with the host's
   libraries, all bound read-only under ``/run/rolloutd-host`` (as bwrap does for images), so
   the image needs no Python; it connects back to the socket, and the worker stops listening.
   From then on every command of the runtime (harness, ``exec``, prepare steps, checks) is
   forked by the exec server inside the container, with exactly the environment sent over the
   socket: a task's environment never reaches the CLI process or a command line.

Isolation (podman-run(1), podman 4.3):

- user namespace: ``--uidmap 0:{USERNS_BASE}:65536`` (and ``--gidmap``): the container's root
  is the unprivileged host uid :data:`USERNS_BASE`; files the worker hands to the runtime
  (workspace, HOME, uploads) are chowned to it (:meth:`adopt`). Commands run as the container's
  root (tasks' images expect it: apt-get, pip), with podman's default capabilities, which hold
  in the user namespace only, and ``--security-opt no-new-privileges``. The exec server is not
  dumpable and, as pid 1, gets no signal it does not handle from inside (it handles none a
  command could use to end it), so a command cannot end or trace it;
- network: ``--network none`` (loopback only); with ``network: gateway`` the exec server also
  listens on ``127.0.0.1:8300`` and relays byte for byte to the unix socket of the runtime's
  :class:`~rolloutd.sandbox.runtimes.gateway_relay.GatewayRelay`, which admits only the
  session's ``/s/{key}/`` routes (bwrap's design); ``host`` shares the host's network;
- mounts: the workspace (read-write) at ``spec.workdir``, the runtime's HOME at
  ``/home/agent``, the ``net`` folder at ``/run/rolloutd`` (read-only), the exec server's code
  and Python, and the harness CLIs of the host read-only at their host paths (the npm prefix,
  the Python harness CLIs' environments, the Python installations they and rolloutd's Python
  harness run on), with the host's ``node`` on ``PATH`` (``/run/rolloutd-host/bin``). Host
  CLIs run on the image's C library: images built ``FROM`` the base image (the host's Debian)
  run them; an image with an older glibc than the host's may not;
- limits: ``--cpus``, ``--memory`` (and ``--memory-swap`` equal: no swap), ``--pids-limit``,
  ``/tmp`` a tmpfs of ``tmpfs_mb`` (``--tmpfs``); ``disk_mb`` bounds the runtime's folder
  (workspace and home: a sized disk, :mod:`~rolloutd.sandbox.runtimes.disk`), not the
  container's writable layer (podman's overlay storage on ext4 cannot be sized);
  :attr:`ExecResult.oom_killed` reads the container's memory cgroup;
- PID, IPC, UTS and mount namespaces of its own; ``--hostname rolloutd``.

Labels: ``rolloutd.runtime_id``, ``rolloutd.root`` (the runtime root) and ``rolloutd.host_id``:
a worker that starts reclaims by label the containers of runtimes whose owner died
(:mod:`rolloutd.sandbox.reclaim`). A killed worker also ends its containers by itself: the exec
server exits when its control socket closes, which ends the container, which ``--rm`` removes.

Teardown (:meth:`stop`): ``podman rm --force --volumes`` removes the running container (its pid
1 killed, everything in it with it) and its anonymous volumes (an image's ``VOLUME``), then the
exec server's socket is closed;
no network or named volume is ever created. Nothing is left: ``podman ps -a``, ``podman volume
ls`` and ``podman network ls`` filtered by the labels show nothing (tests/sandbox).

Docker (:class:`DockerRuntime`): the same code with ``docker``; the daemon's own user namespace
(``userns-remap`` in daemon.json) replaces ``--uidmap``, and the runtime refuses to start on a
daemon that neither remaps users nor runs rootless (:func:`docker_isolation`), where a
container's root is the host's; a host publishes docker in its default policy only when its
daemon passes that check. The workspace is seeded only from an image whose ``WORKDIR`` is
``spec.workdir`` (``docker cp``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import structlog

from rolloutd.errors import ConfigError, ExecServerError, RuntimeStartError
from rolloutd.sandbox.config import npm_prefix, tool_python_dirs, tools_dir
from rolloutd.sandbox.runtimes import podman_images
from rolloutd.sandbox.runtimes.base import check_spec_network
from rolloutd.sandbox.runtimes.bwrap import exec_server_pyc
from rolloutd.sandbox.runtimes.exec_runtime import GATEWAY_PORT, ExecServerRuntime
from rolloutd.sandbox.runtimes.exec_server import ExecServerClient
from rolloutd.sandbox.runtimes.gateway_relay import GatewayRelay
from rolloutd.sandbox.runtimes.roots import HOME_INSIDE, HOST_INSIDE, host_python, python_dirs
from rolloutd.types import RuntimeSpec

log = structlog.get_logger(__name__)

#: ``--pids-limit`` of a container whose spec sets no ``max_processes`` (a trusted caller's:
#: the sandbox policy's default always sets one)
DEFAULT_PIDS_LIMIT = 4096

#: the host uid (and gid) the container's root maps to; the container's uids 0..65535 map to
#: ``USERNS_BASE``..``USERNS_BASE + 65535``, a range no host user should own.
USERNS_BASE = 1_000_000
#: uids (and gids) mapped into each container.
USERNS_SIZE = 65536
#: where the runtime's ``net`` folder (control and gateway sockets) is bound inside.
NET_DIR_INSIDE = "/run/rolloutd"
#: the exec server's compiled script inside.
EXEC_SERVER_INSIDE = "/run/rolloutd-exec-server.pyc"
#: the folder of host binaries put first on PATH inside (``node``).
HOST_BIN_INSIDE = f"{HOST_INSIDE}/bin"
#: seconds the container may take to start and its exec server to connect back.
START_TIMEOUT_S = 60.0
#: seconds the container may take to end once its exec server's socket is closed.
EXIT_WAIT_S = 2.0
#: times teardown tries ``podman rm`` (a container exiting by itself meanwhile refuses one).
RM_ATTEMPTS = 5
#: the label naming a container's runtime id (and the others, see the module docstring).
RUNTIME_LABEL = "rolloutd.runtime_id"
ROOT_LABEL = "rolloutd.root"
HOST_LABEL = "rolloutd.host_id"
#: folders inside that a workdir must not be (or be below).
RESERVED_INSIDE = ("/", "/proc", "/sys", "/dev", "/run", HOME_INSIDE, "/tmp", "/etc", "/usr")

#: (image id, workdir) -> whether the image holds files there (a cache of seeding checks).
_seedable: dict[tuple[str, str], bool] = {}


class PodmanRuntime(ExecServerRuntime):
    """A runtime in a podman container; see the module docstring.

    Args:
        spec, runtime_id, root, grace_s, policy: as :class:`Runtime`.
        host_id: this host's id, a label of the container (reclaim).

    Raises:
        ConfigError: ``spec.workdir`` is a folder the runtime needs for itself, or the
            network policy is unknown.
    """

    type = "podman"
    binary_name: ClassVar[str] = "podman"
    #: whether ``--uidmap``/``--gidmap`` give each container a user namespace (podman);
    #: docker's daemon maps users itself.
    map_users: ClassVar[bool] = True
    enclosure = "container"

    def __init__(
        self, spec: RuntimeSpec, runtime_id: str, root: Path, *, host_id: str = "", **kwargs: Any
    ) -> None:
        check_spec_network(spec, ("gateway", "none", "host"), self.type)
        workdir = PurePosixPath(spec.workdir)
        if any(workdir == PurePosixPath(r) for r in RESERVED_INSIDE) or any(
            workdir.is_relative_to(r) for r in RESERVED_INSIDE[1:6]
        ):
            raise ConfigError(
                f"runtime.workdir {spec.workdir!r} is a folder the {self.type} runtime needs; "
                "use another (e.g. /workspace, /app, /testbed)"
            )
        super().__init__(spec, runtime_id, root, **kwargs)
        self.workdir = spec.workdir
        self.home = HOME_INSIDE
        self.host_id = host_id
        self.binary = shutil.which(self.binary_name) or self.binary_name
        self.name = f"rolloutd-{runtime_id}"
        self.net_dir = self.runtime_dir / "net"
        self.image = spec.image or ""
        #: whether :meth:`start` built the image now (a cache miss).
        self.built_image = False
        self.container_id = ""
        self._image_id = ""
        self._image_env: dict[str, str] = {}
        self.uid = self.gid = USERNS_BASE if self.map_users else 0
        #: seconds of each start step (image, seed, run, connect), for the benchmark.
        self.timings: dict[str, float] = {}

    @property
    def image_id(self) -> str | None:
        """The id of the image the container runs (its sha256, hex), once started."""
        return self._image_id or None

    # -- what the container is made of -------------------------------------------------
    def _tool_dirs(self) -> list[Path]:
        """Host folders of harness CLIs bound read-only at their host paths."""
        dirs: list[Path] = []
        for d in [*python_dirs(), npm_prefix(), tools_dir(), *tool_python_dirs()]:
            if d.is_dir() and not any(d.is_relative_to(c) for c in dirs):
                dirs.append(d)
        return dirs

    def labels(self) -> dict[str, str]:
        """The container's labels (reclaim finds orphans by them)."""
        return {
            RUNTIME_LABEL: self.runtime_id,
            ROOT_LABEL: str(self.runtime_dir.parent),
            HOST_LABEL: self.host_id,
        }

    def run_argv(self) -> list[str]:
        """The ``podman run`` command line of the runtime's container (every value validated
        by :class:`RuntimeSpec` or made here; ``--`` before the image)."""
        spec = self.spec
        argv = [self.binary, "run", "--detach", "--rm", "--name", self.name]
        for key, value in self.labels().items():
            argv += ["--label", f"{key}={value}"]
        if self.map_users:
            argv += [
                "--uidmap",
                f"0:{USERNS_BASE}:{USERNS_SIZE}",
                "--gidmap",
                f"0:{USERNS_BASE}:{USERNS_SIZE}",
            ]
        argv += [
            "--security-opt",
            "no-new-privileges",
            "--hostname",
            "rolloutd",
            "--ipc",
            "private",
            "--network",
            "host" if spec.network == "host" else "none",
            "--pids-limit",
            str(spec.max_processes or DEFAULT_PIDS_LIMIT),
            "--workdir",
            self.workdir,
        ]
        if spec.memory_mb:
            argv += ["--memory", f"{spec.memory_mb}m", "--memory-swap", f"{spec.memory_mb}m"]
        if spec.cpus:
            argv += ["--cpus", str(spec.cpus)]
        if spec.tmpfs_mb:
            argv += ["--tmpfs", f"/tmp:rw,size={spec.tmpfs_mb}m,mode=1777"]
        binds = [
            (self.workspace, self.workdir, "rw"),
            (self.host_home, self.home, "rw"),
            (self.net_dir, NET_DIR_INSIDE, "ro"),
            (self.runtime_dir / "exec-server.pyc", EXEC_SERVER_INSIDE, "ro"),
        ]
        prefix, _, libs = host_python()
        binds.append((prefix, f"{HOST_INSIDE}/python", "ro"))
        binds += [(path, f"{HOST_INSIDE}/lib/{name}", "ro") for name, path in libs.items()]
        if node := shutil.which("node"):
            binds.append((Path(node).resolve(), f"{HOST_BIN_INSIDE}/node", "ro"))
        binds += [(d, str(d), "ro") for d in self._tool_dirs()]
        for source, target, mode in binds:
            argv += ["--volume", f"{source}:{target}:{mode}"]
        _, executable, libs = host_python()
        loader = next(name for name in libs if name.startswith("ld-"))
        argv += [
            "--entrypoint",
            f"{HOST_INSIDE}/lib/{loader}",
            "--",
            self.image,
            "--library-path",
            f"{HOST_INSIDE}/lib",
            f"{HOST_INSIDE}/python/{executable}",
            "-S",
            "-I",
            EXEC_SERVER_INSIDE,
            f"{NET_DIR_INSIDE}/control.sock",
            "-1",
            "-1",
        ]
        if spec.network == "gateway":
            argv += [str(GATEWAY_PORT), f"{NET_DIR_INSIDE}/gateway.sock"]
        return argv

    def rm_argv(self) -> list[str]:
        """The command line removing the container and its anonymous volumes."""
        return [self.binary, "rm", "--force", "--volumes", "--ignore", "--time", "0", self.name]

    def _base_env(self) -> dict[str, str]:
        path = self._image_env.get("PATH") or podman_images.BASE_ENV_PATH
        return {
            **self._image_env,
            "PATH": f"{HOST_BIN_INSIDE}:{path}",
            "HOME": self.home,
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "TERM": "dumb",
            "ROLLOUTD_RUNTIME_ID": self.runtime_id,
        }

    def _adopts(self) -> bool:
        """Uploads go to the container's root (host uid :data:`USERNS_BASE`) when podman maps
        users; docker's daemon maps them itself."""
        return self.map_users

    # -- lifecycle ------------------------------------------------------------------------
    async def _resolve_image(self) -> None:
        """Build or find the image (step 1); read its environment."""
        began = time.monotonic()
        if self.spec.build is not None:
            network = bool(self.policy and self.policy.build_network)
            self.image, self.built_image = await podman_images.ensure_built(
                self.binary,
                self.spec.build,
                network=network,
                root=self.runtime_dir.parent,
                images=self.policy.images if self.policy else None,
            )
        elif not self.image:
            self.image = await podman_images.ensure_base_image(self.binary)
        config = await podman_images.image_config(self.binary, self.image)
        if config is None:
            code, out = await podman_images.cli(
                self.binary, "pull", "--quiet", "--", self.image, timeout_s=1800
            )
            config = await podman_images.image_config(self.binary, self.image)
            if code != 0 or config is None:
                raise RuntimeStartError(
                    f"{self.type} runtime: image {self.image!r} is not here and cannot be "
                    f"pulled: {out.strip()[-300:]}",
                    retryable=False,
                )
        self._image_id = str(config.get("Id", ""))
        for entry in config.get("Env") or []:
            name, _, value = str(entry).partition("=")
            self._image_env[name] = value
        self._working_dir = str(config.get("WorkingDir") or "")
        self.timings["image_s"] = time.monotonic() - began

    async def _seed_workspace(self) -> None:
        """Copy what the image holds at the workdir into the workspace (step 2), keeping the
        files ``spec.files`` wrote."""
        key = (self._image_id, self.workdir)
        if _seedable.get(key) is False:
            return
        began = time.monotonic()
        code, out = await podman_images.cli(self.binary, "image", "mount", "--", self.image)
        if code != 0:
            raise RuntimeStartError(f"{self.type} image mount failed: {out.strip()[-300:]}")
        try:
            mountpoint = os.path.realpath(out.strip().splitlines()[-1])
            # an image's symlink (`/app -> /etc`) resolves against the host's root here:
            # whatever the workdir resolves to must stay inside the image
            source = Path(os.path.realpath(Path(mountpoint, self.workdir.lstrip("/"))))
            inside = source.is_relative_to(mountpoint)
            if not inside:
                log.warning("image_workdir_leaves_image", image=self.image, workdir=self.workdir)
            seedable = inside and source.is_dir() and any(source.iterdir())
            _seedable[key] = seedable
            if seedable:
                await asyncio.to_thread(_copy_missing, source, self.workspace)
        finally:
            await podman_images.cli(self.binary, "image", "unmount", "--", self.image)
        self.timings["seed_s"] = time.monotonic() - began

    async def _check(self) -> None:
        if shutil.which(self.binary_name) is None:
            raise ConfigError(f"{self.type} runtime: `{self.binary_name}` is not installed")
        await self._resolve_image()
        await self._seed_workspace()
        for folder in (self.workspace, self.host_home):
            await self.adopt(folder)
        await self._start_container()

    async def _start_container(self) -> None:
        """Listen, run the container, accept its exec server (step 3)."""
        began = time.monotonic()
        self.net_dir.mkdir(parents=True, exist_ok=True)
        (self.runtime_dir / "exec-server.pyc").write_bytes(exec_server_pyc())
        if self.spec.network == "gateway":
            self.relay = GatewayRelay(self.net_dir / "gateway.sock")
            await self.relay.start()
        control_path = self.net_dir / "control.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listener.bind(str(control_path))
            os.chown(control_path, self.uid, self.gid)  # the container's root may connect
            os.chmod(control_path, 0o600)
            listener.listen(1)
            listener.setblocking(False)
            code, out = await podman_images.cli(
                self.binary, *self.run_argv()[1:], cwd=self.runtime_dir
            )
            if code != 0:
                raise RuntimeStartError(
                    f"{self.type} runtime {self.runtime_id}: run exited {code}: "
                    f"{out.strip()[-500:]}"
                )
            self.container_id = out.strip().splitlines()[-1] if out.strip() else ""
            self.timings["run_s"] = time.monotonic() - began
            loop = asyncio.get_running_loop()
            try:
                conn, _ = await asyncio.wait_for(loop.sock_accept(listener), START_TIMEOUT_S)
            except TimeoutError as exc:
                _, logs = await podman_images.cli(self.binary, "logs", self.name)
                raise RuntimeStartError(
                    f"{self.type} runtime {self.runtime_id}: the exec server did not connect "
                    f"within {START_TIMEOUT_S:.0f} s: {logs.strip()[-500:]}"
                ) from exc
        finally:
            listener.close()
            control_path.unlink(missing_ok=True)
        self._exec_server = ExecServerClient(conn, self.runtime_id)
        try:
            await self._exec_server.ready(START_TIMEOUT_S)
            await self._exec_server.prime()
        except (TimeoutError, ExecServerError) as exc:
            _, logs = await podman_images.cli(self.binary, "logs", self.name)
            raise RuntimeStartError(
                f"{self.type} runtime {self.runtime_id}: exec server did not start ({exc!r}): "
                f"{logs.strip()[-500:]}"
            ) from exc
        self.timings["connect_s"] = time.monotonic() - began - self.timings["run_s"]

    def _cgroup_count(self, controller: str, names: tuple[str, ...], key: str) -> int:
        """The ``key`` line of the first of ``names`` in the container's ``controller`` cgroup
        (v1 and v2; podman's cgroupfs and systemd layouts, docker's); 0 when none is found."""
        cid = self.container_id
        for folder in (
            f"/sys/fs/cgroup/{controller}/libpod_parent/libpod-{cid}",
            f"/sys/fs/cgroup/libpod_parent/libpod-{cid}",
            f"/sys/fs/cgroup/machine.slice/libpod-{cid}.scope",
            f"/sys/fs/cgroup/{controller}/machine.slice/libpod-{cid}.scope",
            f"/sys/fs/cgroup/{controller}/docker/{cid}",
            f"/sys/fs/cgroup/system.slice/docker-{cid}.scope",
        ):
            for name in names:
                with contextlib.suppress(OSError):
                    for line in Path(folder, name).read_text().splitlines():
                        found, _, value = line.partition(" ")
                        if found == key:
                            return int(value)
        return 0

    def _oom_kills(self) -> int:
        """``oom_kill`` of the container's memory cgroup (v1 ``memory.oom_control``, v2
        ``memory.events``)."""
        if not self.spec.memory_mb or not self.container_id:
            return 0
        return self._cgroup_count("memory", ("memory.events", "memory.oom_control"), "oom_kill")

    def ceilings_reached(self) -> dict[str, str]:
        """The ceilings the container reached (see :meth:`Runtime.ceilings_reached`): forks
        its pids cgroup refused, the memory cgroup's OOM kills and a full disk; ``/tmp``
        (``--tmpfs`` sized) holds but is not read here, and the writable layer is not bounded
        while the session runs (docs/runtimes.md, "Ceilings")."""
        reached = {}
        spec = self.spec
        if self.container_id and (refused := self._cgroup_count("pids", ("pids.events",), "max")):
            reached["max_processes"] = (
                f"max_processes={spec.max_processes or DEFAULT_PIDS_LIMIT} reached: the kernel "
                f"refused {refused} fork(s) (pids cgroup)"
            )
        if spec.memory_mb and (killed := self._oom_kills()):
            reached["memory_mb"] = (
                f"memory_mb={spec.memory_mb} reached: the kernel's OOM killer killed "
                f"{killed} process(es) (memory cgroup)"
            )
        if why := self.disk_reached():
            reached["disk_mb"] = why
        return reached

    async def _cleanup(self) -> None:
        began = time.monotonic()
        # removed while it runs (SIGKILL to pid 1 ends everything in it); closing the exec
        # server first would race its exit with the removal ("container state improper")
        for attempt in range(RM_ATTEMPTS):
            code, out = await podman_images.cli(self.binary, *self.rm_argv()[1:])
            if code == 0 or "no such container" in out.lower():
                break
            log.info("container_remove_retried", name=self.name, output=out.strip()[-200:])
            await asyncio.sleep(0.2 * (attempt + 1))
        else:
            log.warning(
                "container_remove_failed", runtime=self.type, name=self.name, output=out[-300:]
            )
        if self._exec_server is not None:
            self._exec_server.close()
            self._exec_server = None
        if self.relay is not None:
            await self.relay.close()
        log.debug(
            "runtime_cleaned_up",
            runtime_id=self.runtime_id,
            duration_s=round(time.monotonic() - began, 4),
        )


def docker_isolation(binary: str) -> str | None:
    """Why the Docker daemon behind ``binary`` does not isolate users, or None when it does:
    it remaps users (``userns-remap``: ``name=userns`` in ``docker info``'s security options)
    or runs rootless (``name=rootless``). Without either a container's root is the host's root.
    """
    try:
        out = subprocess.run(
            [binary, "info", "--format", "{{json .SecurityOptions}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`{binary} info` failed: {exc}"
    options = out.strip()
    if "name=userns" in options or "name=rootless" in options:
        return None
    return (
        f"the Docker daemon neither remaps users (userns-remap in daemon.json) nor runs "
        f"rootless (security options: {options[:200]}): a container's root would be the "
        "host's root"
    )


class DockerRuntime(PodmanRuntime):
    """The same runtime through the Docker CLI (see the module docstring for what differs).

    Raises:
        ConfigError: at start, when the daemon neither remaps users nor runs rootless
            (:func:`docker_isolation`).
    """

    type = "docker"
    binary_name = "docker"
    map_users = False

    async def _check(self) -> None:
        if shutil.which(self.binary_name) is not None:
            why = await asyncio.to_thread(docker_isolation, self.binary)
            if why is not None:
                raise ConfigError(f"docker runtime refused: {why}")
        await super()._check()

    def rm_argv(self) -> list[str]:
        return [self.binary, "rm", "--force", "--volumes", self.name]

    async def _seed_workspace(self) -> None:
        """Docker has no ``image mount``: an image whose ``WORKDIR`` is the workdir is copied
        from a created (never started) container with ``docker cp``."""
        if self._working_dir != self.workdir:
            return
        name = f"{self.name}-seed"
        code, out = await podman_images.cli(self.binary, "create", "--name", name, "--", self.image)
        if code != 0:
            raise RuntimeStartError(f"docker create failed: {out.strip()[-300:]}")
        try:
            staging = self.runtime_dir / "seed"
            code, out = await podman_images.cli(
                self.binary, "cp", f"{name}:{self.workdir}/.", str(staging)
            )
            if code == 0:
                await asyncio.to_thread(_copy_missing, staging, self.workspace)
            shutil.rmtree(staging, ignore_errors=True)
        finally:
            await podman_images.cli(self.binary, "rm", "--force", name)


def _copy_missing(source: Path, target: Path) -> None:
    """Copy the tree ``source`` into ``target``, keeping files that already exist there
    (symlinks copied as links, modes kept, owners not)."""
    for folder, dirs, files in os.walk(source):
        rel = Path(folder).relative_to(source)
        (target / rel).mkdir(parents=True, exist_ok=True)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            src, dst = Path(folder, name), target / rel / name
            if dst.exists() or dst.is_symlink():
                continue
            if src.is_symlink():
                dst.symlink_to(os.readlink(src))
            else:
                shutil.copy2(src, dst)


def container_binaries() -> list[str]:
    """The container CLIs installed here (reclaim looks for orphans with each)."""
    return [b for b in ("podman", "docker") if shutil.which(b)]
