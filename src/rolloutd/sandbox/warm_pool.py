"""The warm pool: podman containers and bwrap sandboxes started ahead of demand on a sandbox
host, each claimed by at most one session (the field's answer to cold container starts:
kubernetes-sigs/agent-sandbox ``SandboxWarmPool``, rLLM's warm queue).

A warm runtime is a :class:`~rolloutd.sandbox.runtimes.podman.PodmanRuntime` or
:class:`~rolloutd.sandbox.runtimes.bwrap.BwrapRuntime` started from a spec without ``files``,
``env`` or ``prepare``: for podman its image resolved, its workspace seeded from the image, its
container running; for bwrap its folder on its sized disk, its cgroup, its sandbox running
(the "prepared root" and more); for both its exec server connected. It is keyed by everything
fixed when it started (:class:`PoolKey`: runtime type, image (podman: its digest; bwrap: its
folder), workdir, network, the limit tier, the user namespace's uid range, seccomp and
``no-new-privileges``) and a session claims one only when the key of its own spec is exactly
equal. At claim the session's spec is checked against the host's policy again, its ``files``
are written (component-wise, never through a link, and handed to the runtime's user), its
``env`` becomes the runtime's, and its ``prepare`` steps run: what the session sees is what a
cold start would have made. A claimed runtime leaves the pool for
good and is torn down with its session like any other: a used runtime is never reused.

Size: each key a session asked for (hit or miss) is kept ``size`` deep, plus its share of
the sessions waiting for this host (:meth:`WarmPool.set_waiting`, read from the sandbox
queue's backlog by the fleet: :func:`rolloutd.workers.capacity.sandbox_backlog`). A key's
share is its part of the last :data:`RECENT_ASKS` asks, rounded up. A lower target stops
the surplus ready runtimes of a key.

Bounds: warm runtimes count against the host's capacity (the pool fills only while the
host's live runtimes plus its warm ones stay under ``max_concurrent_sessions``) but hold no
session slot (:class:`~rolloutd.workers.capacity.RuntimeSlots` counts live runtimes only),
so a session never waits for a warm runtime nobody claims. Only runtime types the host's
policy lists are pooled, and a warm runtime starts under that policy.

Ownership: each warm runtime has an owner record (:mod:`rolloutd.sandbox.reclaim`) from
before it starts, so a killed worker's warm runtimes end by themselves (a container's exec
server exits when its socket closes; a bwrap sandbox dies with its parent) or are reclaimed
by the next worker on the root. :meth:`WarmPool.drain` stops
them all when the policy changes (:meth:`WarmPool.set_policy`); :meth:`WarmPool.close` stops
them for good when the host drains or the worker shuts down.

Not pooled (a claim is a miss, the session starts cold): runtime types other than podman and
bwrap, specs with a Dockerfile (``build``), and an image not in the host's store.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from rolloutd.errors import PolicyError
from rolloutd.observability import metrics
from rolloutd.sandbox import reclaim
from rolloutd.sandbox.runtimes import Runtime, create_runtime
from rolloutd.sandbox.runtimes import podman_images as images
from rolloutd.sandbox.runtimes.podman import USERNS_BASE, USERNS_SIZE, PodmanRuntime
from rolloutd.sandbox.runtimes.prepare import run_prepare
from rolloutd.sandbox_policy import SandboxPolicy, check_message, violations, with_default_limits
from rolloutd.types import RuntimeSpec

log = structlog.get_logger(__name__)

#: runtime types the pool holds.
POOLED_TYPES = ("podman", "bwrap")
#: what a key's ``seccomp`` says, by runtime type: the profile and privilege flags each
#: runtime starts every sandbox with (bwrap sets ``PR_SET_NO_NEW_PRIVS`` itself).
SECCOMP = {
    "podman": "podman-default,no-new-privileges",
    "bwrap": "rolloutd-bwrap,no-new-privileges",
}
#: prefix of a warm runtime's id (its folder, container name and owner record).
WARM_PREFIX = "warm-"
#: asks (claims, hit or miss) whose keys split the waiting sessions between keys.
RECENT_ASKS = 64


@dataclass(frozen=True)
class PoolKey:
    """Everything fixed when a warm runtime started; a claim matches it exactly.

    Attributes:
        type: the runtime type.
        image_id: podman: the image's digest (sha256 hex, ``podman image inspect``'s
            ``Id``); bwrap: the image folder ("": the host's system).
        workdir, network, max_processes, memory_mb, cpus, disk_mb, tmpfs_mb: as
            :class:`~rolloutd.types.RuntimeSpec`, after the policy's default limits.
        uid_range: the container's uid map, ``(first host uid, count)``; (0, 0): none.
        seccomp: the seccomp profile and privilege flags the container started with.
    """

    type: str
    image_id: str
    workdir: str
    network: str
    max_processes: int | None
    memory_mb: int | None
    cpus: float | None
    disk_mb: int | None
    tmpfs_mb: int | None
    uid_range: tuple[int, int]
    seccomp: str


def blank(spec: RuntimeSpec) -> RuntimeSpec:
    """``spec`` without what a claim applies (files, env, prepare steps)."""
    return spec.model_copy(update={"files": {}, "env": {}, "prepare": []})


class WarmPool:
    """The warm runtimes of one sandbox host; see the module docstring.

    Args:
        root: the host's runtime root (``SandboxSettings.runtime_root``).
        policy: the host's sandbox policy (warm runtimes start under it).
        host_id: this host's id (a container label).
        size: warm runtimes kept per key asked for, waiting sessions aside; 0 turns the
            pool off.
        room: how many more runtimes the host may hold now (its capacity less its live
            runtimes), read before each warm start; None: unbounded (tests, benchmarks).
        grace_s: as :func:`~rolloutd.sandbox.runtimes.create_runtime`.
    """

    def __init__(
        self,
        root: Path,
        policy: SandboxPolicy | None,
        host_id: str = "",
        *,
        size: int = 1,
        room: Callable[[], int] | None = None,
        grace_s: float = 5.0,
    ) -> None:
        self.root = Path(root)
        self.policy = policy
        self.host_id = host_id
        self.size = size
        self.room = room
        self.grace_s = grace_s
        self._ready: dict[PoolKey, list[Runtime]] = {}
        #: the blank spec of every key a session asked for (what a refill starts)
        self._wanted: dict[PoolKey, RuntimeSpec] = {}
        self._starting: dict[PoolKey, int] = {}
        self._generation = 0
        self._tasks: set[asyncio.Task[None]] = set()
        #: surplus runtimes being stopped (awaited by :meth:`drain`, never cancelled)
        self._stops: set[asyncio.Task[None]] = set()
        #: set by :meth:`close`: nothing starts any more
        self.closed = False
        #: sessions waiting for this host (:meth:`set_waiting`)
        self.num_waiting = 0
        #: keys of the last asks, newest last
        self._asks: deque[PoolKey] = deque(maxlen=RECENT_ASKS)

    def __len__(self) -> int:
        """Warm runtimes ready and being started."""
        return sum(map(len, self._ready.values())) + sum(self._starting.values())

    def runtime_ids(self) -> list[str]:
        """The ids of the warm runtimes ready now."""
        return [r.runtime_id for ready in self._ready.values() for r in ready]

    async def key_of(self, spec: RuntimeSpec) -> PoolKey | None:
        """The pool key of ``spec`` (the policy's default limits applied), or None when it is
        not pooled (another runtime type, a Dockerfile, an image not in the store)."""
        if self.size < 1 or spec.type not in POOLED_TYPES or spec.build is not None:
            return None
        if self.policy is not None and spec.type not in self.policy.runtimes:
            return None  # refused where it starts, warm or cold
        if self.policy is not None:
            spec = with_default_limits(spec, self.policy)
        image_id, uid_range = spec.image or "", (0, 0)
        if spec.type == "podman":
            name = spec.image or images.BASE_IMAGE
            config = await images.image_config(PodmanRuntime.binary_name, name)
            if config is None or not config.get("Id"):
                return None
            image_id = str(config["Id"])
            uid_range = (USERNS_BASE, USERNS_SIZE) if PodmanRuntime.map_users else (0, 0)
        return PoolKey(
            type=spec.type,
            image_id=image_id,
            workdir=spec.workdir,
            network=spec.network,
            max_processes=spec.max_processes,
            memory_mb=spec.memory_mb,
            cpus=spec.cpus,
            disk_mb=spec.disk_mb,
            tmpfs_mb=spec.tmpfs_mb,
            uid_range=uid_range,
            seccomp=SECCOMP[spec.type],
        )

    async def claim(self, spec: RuntimeSpec) -> Runtime | None:
        """A warm runtime whose key equals ``spec``'s, made the session's: policy checked,
        files written, env set, prepare steps run; None on a miss (the caller starts cold).
        Either way the key is remembered and its pool refilled in the background.

        Raises:
            PolicyError: ``spec`` is outside the policy (the warm runtime is stopped).
            RuntimeStartError: a prepare step failed (the runtime is stopped).
        """
        began = time.monotonic()
        key = await self.key_of(spec)
        if key is None:
            return None
        self._wanted.setdefault(key, blank(spec))
        self._asks.append(key)
        ready = self._ready.get(key)
        runtime = ready.pop(0) if ready else None
        self.refill()
        if runtime is None:
            metrics.WARM_POOL_CLAIMS.labels(result="miss").inc()
            return None
        try:
            await self._apply(runtime, spec)
        except BaseException:
            await self._discard(runtime)
            raise
        seconds = time.monotonic() - began
        metrics.WARM_POOL_CLAIMS.labels(result="hit").inc()
        metrics.WARM_POOL_CLAIM_SECONDS.observe(seconds)
        log.info("warm_runtime_claimed", runtime_id=runtime.runtime_id, duration_s=seconds)
        return runtime

    async def _apply(self, runtime: Runtime, spec: RuntimeSpec) -> None:
        """Make ``runtime`` the session's: what :meth:`Runtime.start` does with ``spec``'s
        files, env and prepare steps."""
        if self.policy is not None:
            spec = with_default_limits(spec, self.policy)
            found = await asyncio.to_thread(violations, spec, self.policy, resolve=True)
            if found:
                raise PolicyError(f"runtime {runtime.runtime_id}: {check_message(found)}")
        runtime.spec = spec
        for path, text in spec.files.items():  # never through a link, handed to its user
            await runtime.upload(path, text.encode("utf-8"))
        if spec.prepare:
            await run_prepare(runtime, spec.prepare)

    def target(self, key: PoolKey) -> int:
        """Warm runtimes wanted for ``key``: ``size``, plus the key's share of the waiting
        sessions (its part of the recent asks, rounded up); 0 for a key never asked for."""
        if key not in self._wanted:
            return 0
        asks = Counter(self._asks)
        share = self.num_waiting * asks[key] / len(self._asks) if self._asks else 0.0
        return self.size + math.ceil(share)

    def set_waiting(self, num_waiting: int) -> None:
        """Size the pool for ``num_waiting`` sessions waiting for this host: start what each
        key lacks (within the host's room), stop the ready runtimes above a lower target.

        Args:
            num_waiting: this host's share of the sessions waiting in the sandbox queue
                (its backlog over the hosts polling it); negative counts as 0.
        """
        self.num_waiting = max(0, num_waiting)
        for key, ready in self._ready.items():
            surplus = len(ready) + self._starting.get(key, 0) - self.target(key)
            for _ in range(min(surplus, len(ready))):
                task = asyncio.ensure_future(self._discard(ready.pop()))
                self._stops.add(task)
                task.add_done_callback(self._stops.discard)
        self.refill()

    def refill(self) -> None:
        """Start, in the background, the warm runtimes each wanted key lacks
        (:meth:`target`), within the host's room; nothing once closed."""
        if self.closed:
            return
        for key, spec in self._wanted.items():
            missing = self.target(key) - len(self._ready.get(key, ())) - self._starting.get(key, 0)
            for _ in range(max(0, missing)):
                if self.room is not None and self.room() - len(self) < 1:
                    return
                self._starting[key] = self._starting.get(key, 0) + 1
                task = asyncio.ensure_future(self._warm(key, spec, self._generation))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _warm(self, key: PoolKey, spec: RuntimeSpec, generation: int) -> None:
        runtime_id = f"{WARM_PREFIX}{uuid.uuid4().hex[:12]}"
        runtime: Runtime | None = None
        try:
            reclaim.claim(self.root, runtime_id, self.host_id)
            runtime = create_runtime(
                spec,
                runtime_id,
                self.root,
                grace_s=self.grace_s,
                policy=self.policy,
                host_id=self.host_id,
            )
            await runtime.start()
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError):
                log.warning("warm_runtime_failed", key=str(key), error=str(e))
            reclaim.release(self.root, runtime_id)
            if isinstance(e, Exception):
                return
            raise
        finally:
            if generation == self._generation:
                self._starting[key] -= 1
        moved = isinstance(runtime, PodmanRuntime) and runtime.image_id != key.image_id
        if generation != self._generation or moved:
            await self._discard(runtime)  # drained meanwhile, or the tag moved
            return
        self._ready.setdefault(key, []).append(runtime)

    async def _discard(self, runtime: Runtime) -> None:
        try:
            await runtime.stop()
        finally:
            reclaim.release(self.root, runtime.runtime_id)

    async def drain(self) -> int:
        """Stop every warm runtime (and those starting); return how many were stopped.

        Starts in flight are waited for, never cancelled: a ``podman run`` cut while it
        starts its container can leave a conmon and a ``runc init`` with no container
        record, which neither the container's end nor reclaim finds. Each sees the new
        generation when it is done and stops what it started."""
        self._generation += 1
        await asyncio.gather(*self._tasks, *self._stops, return_exceptions=True)
        ready = [r for runtimes in self._ready.values() for r in runtimes]
        self._ready.clear()
        self._starting.clear()
        for runtime in ready:
            with contextlib.suppress(Exception):
                await self._discard(runtime)
        if ready:
            log.info("warm_pool_drained", num_runtimes=len(ready))
        return len(ready)

    async def close(self) -> int:
        """Drain the pool for good (the host drains or stops): nothing starts after this;
        return how many warm runtimes were stopped."""
        self.closed = True
        return await self.drain()

    async def set_policy(self, policy: SandboxPolicy | None) -> None:
        """Take a new policy: a changed one drains the pool (its runtimes started under the
        old one) and forgets the keys asked for."""
        if policy == self.policy:
            return
        self.policy = policy
        self._wanted.clear()
        self._asks.clear()
        await self.drain()
