"""Sandbox-fleet activities: provision a runtime, run the harness, collect artifacts, tear down.

``provision_runtime`` runs on the shared queue ``rolloutd-sandbox``; every later activity of the
runtime runs on this host's own queue ``rolloutd-sandbox@{host_id}``, because the runtime lives
on this host only (samples-python worker_specific_task_queues/).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import structlog
from temporalio import activity

from rolloutd.activities.heartbeat import heartbeating
from rolloutd.activities.models import (
    CollectArtifactsInput,
    CollectArtifactsOutput,
    ProvisionRuntimeInput,
    ProvisionRuntimeOutput,
    RestoreFinalStateInput,
    RestoreFinalStateOutput,
    RunHarnessInput,
    RunHarnessOutput,
    TeardownRuntimeInput,
    TeardownRuntimeOutput,
)
from rolloutd.activities.names import (
    COLLECT_ARTIFACTS,
    PROVISION_RUNTIME,
    RESTORE_FINAL_STATE,
    RUN_HARNESS,
    TEARDOWN_RUNTIME,
)
from rolloutd.activities.refused import MAX_FINDINGS, REFUSED_PATHS_ARTIFACT, refused_finding
from rolloutd.errors import (
    HostDrainingError,
    NotFoundError,
    PathRefusedError,
    RuntimeNotFoundError,
    to_application_error,
)
from rolloutd.evaluators import CHECK_ARTIFACT, final_state_parts, run_check
from rolloutd.final_state import FinalState
from rolloutd.http_client import HEALTH_PROBE, new_async_client
from rolloutd.observability import metrics
from rolloutd.proxy.sessions.liveness import BackendVerdict
from rolloutd.sandbox import reclaim
from rolloutd.sandbox.artifacts import apply_patch, git_patch
from rolloutd.sandbox.final_state import image_digest, restore_final_state, store_final_state
from rolloutd.sandbox.harnesses import HarnessAdapter, HarnessCommand, HarnessContext, get_harness
from rolloutd.sandbox.runtimes import Runtime, RuntimeProcess, create_runtime
from rolloutd.sandbox.runtimes.podman import container_binaries
from rolloutd.sandbox.runtimes.podman_images import collect_garbage
from rolloutd.sandbox.warm_pool import WarmPool
from rolloutd.settings import SandboxSettings
from rolloutd.store import BlobStore, CompletionLog, artifact_key, final_state_key
from rolloutd.task_queues import host_queue
from rolloutd.task_spec import artifact_file_name
from rolloutd.types import TamperFinding, TamperReport

log = structlog.get_logger(__name__)

#: seconds between heartbeats of a running harness (cancellation arrives through them).
HEARTBEAT_EVERY_S = 1.0
#: seconds between SIGTERM and SIGKILL of a cancelled harness.
CANCEL_GRACE_S = 1.0
#: heartbeats between two counts of the session's completions (sent as progress).
COUNT_COMPLETIONS_EVERY = 5
#: bytes of harness output kept in the activity result (the whole log goes to the store).
TAIL_BYTES = 4000
#: limit of one ask for the gateway's verdict, seconds (a slow answer skips one beat)
VERDICT_TIMEOUT_S = 2.0


async def gateway_verdict(http: httpx.AsyncClient, session_base_url: str) -> BackendVerdict | None:
    """The gateway's verdict on a session (``GET {base}/rolloutd/verdict``), or None when
    the gateway did not answer (its calls then fail on their own; the next beat asks again).

    Args:
        http: the client to ask with.
        session_base_url: the session's ``{public_url}/s/{key}`` (its Anthropic base URL).
    """
    try:
        response = await http.get(f"{session_base_url}/rolloutd/verdict", timeout=VERDICT_TIMEOUT_S)
        response.raise_for_status()
        return BackendVerdict.model_validate(response.json())
    except (httpx.HTTPError, ValueError) as e:
        log.debug("verdict_not_read", error=repr(e))
        return None


@dataclass
class _RunEnd:
    """How a harness run ended (:meth:`SandboxActivities._watch`)."""

    exit_code: int | None = None
    timed_out: bool = False
    #: Unix time the run budget ran out
    timed_out_at: float | None = None
    #: the gateway's verdict that stopped the harness
    backend_verdict: str | None = None
    #: the signal the sandbox sent the harness itself
    signal_sent: int | None = None
    #: the host began to drain: the run is handed back
    drained: bool = False
    #: the runtime's ceiling the run reached, naming the limit (the harness was stopped)
    limit_reached: str | None = None


class _CeilingWatch:
    """Which of a runtime's ceilings its processes reached since the harness started
    (:meth:`Runtime.ceilings_reached`, read off the event loop: without a sized disk it walks
    the runtime's folder)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.before: set[str] = set()

    async def start(self) -> None:
        """Note what was reached before the harness (by prepare steps): not the run's."""
        self.before = set(await asyncio.to_thread(self.runtime.ceilings_reached))

    async def reached(self) -> str | None:
        """The first ceiling reached since :meth:`start`, in words naming the limit."""
        now = await asyncio.to_thread(self.runtime.ceilings_reached)
        new = [why for name, why in sorted(now.items()) if name not in self.before]
        return new[0] if new else None


class SandboxActivities:
    """The runtimes of this host and the activities that act on them.

    Args:
        settings: the sandbox fleet's settings (host id, runtime root).
        store: the blob store for artifacts and progress.
    """

    def __init__(self, settings: SandboxSettings, store: BlobStore) -> None:
        self.settings = settings
        self.store = store
        self.root = Path(settings.runtime_root)
        # the runtimes' workspaces hold prompts, answers and the session keys' files: a root
        # made here is the worker's alone (mode 0700); one that exists keeps its mode
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.runtimes: dict[str, Runtime] = {}
        self.host_queue = host_queue("sandbox", settings.host_id)
        #: called when a runtime is gone (torn down): the host has room for another
        #: (:class:`rolloutd.workers.capacity.RuntimeSlots`)
        self.on_runtime_gone: Callable[[], None] = lambda: None
        #: set when the worker drains (SIGTERM): harness runs are handed back, runtimes
        #: provisioned from then on are not kept (:meth:`start_drain`)
        self.draining = asyncio.Event()
        #: harness runs handed back by the drain
        self.num_handed_back = 0
        #: background tasks (image garbage collection) kept until done
        self._background: set[asyncio.Future[None]] = set()
        #: asks the gateway's verdict for every run (one client: a new one per run spent
        #: about 40% of this fleet's CPU making its TLS context, by a py-spy profile)
        self._http: httpx.AsyncClient | None = None
        metrics.watch_runtimes(self, settings.host_id)  # rolloutd_runtimes_alive, per scrape
        #: podman containers and bwrap sandboxes started ahead of demand (``warm_pool_size``
        #: per key asked for, plus waiting sessions), within the room the host's live runtimes
        #: leave under max_concurrent_sessions
        self.pool: WarmPool | None = None
        if settings.warm_pool_size:
            self.pool = WarmPool(
                self.root,
                settings.sandbox_policy,
                settings.host_id,
                size=settings.warm_pool_size,
                room=lambda: settings.max_concurrent_sessions - len(self.runtimes),
            )

    def reclaim(self) -> reclaim.ReclaimReport:
        """Kill and remove the runtimes a dead worker left under this host's runtime root,
        their containers included, then collect container images past the host's budget
        (called once when the worker starts, before it polls, in a thread of its own; see
        :mod:`rolloutd.sandbox.reclaim`).
        """
        report = reclaim.reclaim_orphans(self.root)
        asyncio.run(self.collect_images())
        return report

    async def collect_images(self) -> None:
        """Remove the least recently used images this host built from tasks' Dockerfiles
        past ``image_cache_gb`` (:func:`~rolloutd.sandbox.runtimes.podman_images.collect_garbage`);
        a failure is logged, never raised (a full cache is no reason to refuse work)."""
        budget = int(self.settings.image_cache_gb * 1e9)
        for binary in container_binaries():
            try:
                await collect_garbage(binary, self.root, budget)
            except (OSError, ValueError, KeyError) as e:
                log.warning("image_gc_failed", binary=binary, error=str(e))

    def start_drain(self) -> None:
        """Begin the host's drain (docs/decisions.md, "One drain"): each running harness is stopped
        within a heartbeat (about 1 s), its runtime torn down, and its activity fails with
        ``HostDrainingError``, which the session treats as a lost host (a new attempt on another
        host, replaying the recorded calls); a provisioning that ends from now on tears its runtime
        down and fails retryably (Temporal retries it on another host). Collects and teardowns run
        on. Called by :func:`rolloutd.workers.drain.drain_fleet`.
        """
        if not self.draining.is_set():
            log.info(
                "host_draining", host_id=self.settings.host_id, num_runtimes=len(self.runtimes)
            )
        self.draining.set()
        if self.pool is not None:  # no session will claim them
            draining = asyncio.ensure_future(self.pool.close())
            self._background.add(draining)
            draining.add_done_callback(self._background.discard)

    def _draining_error(self, what: str) -> HostDrainingError:
        return HostDrainingError(
            f"sandbox host {self.settings.host_id} is draining (SIGTERM): {what}"
        )

    async def _hand_back(self, runtime_id: str) -> None:
        """Tear a runtime down on the drain's behalf (the workflow's own teardown then finds
        nothing: the host may have stopped polling by the time it is scheduled)."""
        await self.teardown_runtime(TeardownRuntimeInput(runtime_id=runtime_id))

    def _runtime(self, runtime_id: str) -> Runtime:
        runtime = self.runtimes.get(runtime_id)
        if runtime is None:
            raise RuntimeNotFoundError(
                f"runtime {runtime_id} is not on host {self.settings.host_id} (host restarted?)"
            )
        return runtime

    @activity.defn(name=PROVISION_RUNTIME)
    async def provision_runtime(self, input: ProvisionRuntimeInput) -> ProvisionRuntimeOutput:
        """Create and start a runtime for a session on this host."""
        structlog.contextvars.bind_contextvars(
            session_id=input.session_id, attempt=activity.info().attempt
        )
        t0 = time.monotonic()
        tag = "" if input.purpose == "session" else f"-{input.purpose[:8]}"
        runtime_id = f"{_short(input.session_id.replace('/', '.'))}{tag}-{uuid.uuid4().hex[:8]}"
        if self.draining.is_set():
            raise to_application_error(self._draining_error("provisioning refused"))
        try:
            # a warm container of exactly this spec's key, made the session's (policy checked
            # again, files, env, prepare steps); it has its own id and owner record
            warm = await self.pool.claim(input.runtime) if self.pool is not None else None
            if warm is not None:
                runtime, runtime_id = warm, warm.runtime_id
            else:
                runtime = await self._start_cold(input, runtime_id)
        except Exception as e:
            log.warning("runtime_start_failed", runtime=input.runtime.type, error=str(e))
            reclaim.release(self.root, runtime_id)
            raise to_application_error(e) from e
        self.runtimes[runtime_id] = runtime
        if getattr(runtime, "built_image", False):  # a new image: keep the cache in budget
            collecting = asyncio.ensure_future(self.collect_images())
            self._background.add(collecting)
            collecting.add_done_callback(self._background.discard)
        if self.draining.is_set():
            # its run would find this host gone: Temporal retries the provisioning elsewhere
            await self._hand_back(runtime_id)
            raise to_application_error(self._draining_error("runtime stopped after provisioning"))
        duration = time.monotonic() - t0
        log.info(
            "runtime_started",
            runtime=input.runtime.type,
            runtime_id=runtime_id,
            duration_s=round(duration, 4),
        )
        info = activity.info()
        # both times are the server's: the time this attempt waited for a host's capacity
        queue_wait = max(
            0.0, (info.started_time - info.current_attempt_scheduled_time).total_seconds()
        )
        return ProvisionRuntimeOutput(
            runtime_id=runtime_id,
            host_id=self.settings.host_id,
            host_queue=self.host_queue,
            workdir=runtime.workdir,
            duration_s=duration,
            queue_wait_s=queue_wait,
        )

    async def _start_cold(self, input: ProvisionRuntimeInput, runtime_id: str) -> Runtime:
        """Create and start the session's runtime (no warm one matched)."""
        # owned before it exists: a worker killed while provisioning leaves a record that
        # lets the next worker on this root reclaim the half-made runtime
        reclaim.claim(self.root, runtime_id, self.settings.host_id)
        # the host decides the isolation: its policy, checked again here (submit checked it
        # against the policy this host published), before anything starts
        runtime = create_runtime(
            input.runtime,
            runtime_id,
            self.root,
            policy=self.settings.sandbox_policy,
            host_id=self.settings.host_id,
        )
        async with heartbeating(phase="provision"):
            try:
                await runtime.start()
            except asyncio.CancelledError:
                # the session was cancelled while its runtime started: nothing is kept
                with contextlib.suppress(Exception):
                    await runtime.stop()
                reclaim.release(self.root, runtime_id)
                raise
        return runtime

    @activity.defn(name=RUN_HARNESS)
    async def run_harness(self, input: RunHarnessInput) -> RunHarnessOutput:
        """Run the harness to its end, its time budget, or cancellation.

        Heartbeats every second with ``{"elapsed_s", "num_completions"}``, and at each beat
        asks the gateway's verdict on the session: when its model calls have stood unanswered
        for the gateway's ``backend_dead_after_s``, the harness is stopped
        (``backend_verdict``). The harness's whole process group is killed on timeout,
        cancellation or that verdict; then, however the run ended, every process left in the
        runtime is killed (:meth:`Runtime.cancel`) before this returns, so nothing the harness
        started runs on while the session's files are collected.

        Raises:
            ApplicationError: type ``HostDrainingError`` when the host drains (SIGTERM,
                :meth:`start_drain`): the harness is stopped and its runtime torn down, and
                the session starts a new attempt on another host.
        """
        structlog.contextvars.bind_contextvars(
            session_id=input.session_id, attempt=activity.info().attempt
        )
        runtime, adapter, command = await self._prepare_harness(input)
        timeout_s = min(input.timeout_s, runtime.spec.wall_time_s or input.timeout_s)
        ceilings = _CeilingWatch(runtime)
        await ceilings.start()
        t0 = time.monotonic()
        proc = await runtime.spawn(
            command.command, env=command.env, cwd=command.cwd or runtime.workdir, name="harness"
        )
        log.info("harness_started", harness=input.harness.type, pid=proc.pid)
        try:
            end = await self._watch(input, proc, timeout_s, t0, ceilings)
        except asyncio.CancelledError:
            # a cancelled session's output is not wanted: a short grace keeps mass
            # cancellation (a trainer dropping a step's rollouts) within seconds
            await proc.terminate(grace_s=CANCEL_GRACE_S)
            await runtime.cancel()
            log.info("harness_cancelled", duration_s=round(time.monotonic() - t0, 3))
            raise
        if end.drained:
            await self._drain_run(proc, input.runtime_id, time.monotonic() - t0)
        # the run is over: nothing it started may run on while its files are collected
        await runtime.cancel()
        return self._record_run(input, runtime, adapter, proc, end, time.monotonic() - t0)

    async def _prepare_harness(
        self, input: RunHarnessInput
    ) -> tuple[Runtime, HarnessAdapter, HarnessCommand]:
        """The runtime, the adapter and the command it prepared, the sandbox connected to the
        session's routes.

        Raises:
            ApplicationError: the host drains (``HostDrainingError``), or the runtime or the
                adapter refused (:func:`rolloutd.errors.to_application_error`).
        """
        try:
            if self.draining.is_set():
                await self._hand_back(input.runtime_id)
                self.num_handed_back += 1
                raise self._draining_error("harness run handed back before it started")
            runtime = self._runtime(input.runtime_id)
            adapter = get_harness(input.harness)
            # network `gateway`: the sandbox reaches only this session, at a loopback address
            openai_url, anthropic_url, gemini_url = await runtime.connect_gateway(
                input.session.openai_base_url,
                input.session.anthropic_base_url,
                input.session.gemini_base_url,
            )
            ctx = HarnessContext(
                instruction=input.instruction,
                openai_base_url=openai_url,
                anthropic_base_url=anthropic_url,
                gemini_base_url=gemini_url,
                api_key=input.session.session_key,
                model=input.session.model,
                workdir=runtime.workdir,
            )
            command = await adapter.prepare(runtime, ctx)
        except Exception as e:
            raise to_application_error(e) from e
        return runtime, adapter, command

    async def _watch(
        self,
        input: RunHarnessInput,
        proc: RuntimeProcess,
        timeout_s: float,
        t0: float,
        ceilings: _CeilingWatch,
    ) -> _RunEnd:
        """Wait for the harness, heartbeating every second, until it exits, its budget runs
        out (it is terminated), the gateway's verdict is ``backend`` (it is terminated), the
        runtime reaches one of its ceilings (it is terminated: ``limit_reached``) or the host
        drains (left to :meth:`_drain_run`). A ceiling reached by the time the harness exited
        on its own is reported too."""
        end = _RunEnd()
        completions = CompletionLog(self.store, input.session_id)
        beats = num_completions = 0
        http = self._verdict_client()
        while True:
            if self.draining.is_set():
                end.drained = True
                return end
            elapsed = time.monotonic() - t0
            if elapsed >= timeout_s:
                end.timed_out, end.timed_out_at = True, time.time()
                await proc.terminate()
                end.exit_code = proc.returncode
                return end
            end.exit_code = await proc.wait(min(HEARTBEAT_EVERY_S, timeout_s - elapsed))
            if end.exit_code is not None:
                end.limit_reached = await ceilings.reached()
                return end
            if reached := await ceilings.reached():
                # a ceiling is the operator's: the session is scored as reaching it
                # (0.0 after an answered call), so running on would measure nothing
                log.warning("harness_stopped_limit_reached", limit=reached)
                end.limit_reached = reached
                await proc.terminate()
                code = end.exit_code = proc.returncode
                end.signal_sent = -code if code is not None and code < 0 else None
                return end
            beats += 1
            if beats % COUNT_COMPLETIONS_EVERY == 1:  # a store listing: not every beat
                num_completions = await asyncio.to_thread(len, completions)
            activity.heartbeat({"elapsed_s": round(elapsed, 1), "num_completions": num_completions})
            verdict = await gateway_verdict(http, input.session.anthropic_base_url)
            if verdict is not None and verdict.verdict == "backend":
                # the model stopped answering: waiting out the run budget would only
                # delay the failure the session ends with anyway
                log.warning(
                    "harness_stopped_backend_dead",
                    message=verdict.message,
                    unanswered_s=verdict.unanswered_s,
                )
                end.backend_verdict = verdict.message or "backend"
                await proc.terminate()
                code = end.exit_code = proc.returncode
                end.signal_sent = -code if code is not None and code < 0 else None
                return end

    def _verdict_client(self) -> httpx.AsyncClient:
        """The client that asks the gateway's verdicts, made at first use (in the event
        loop) and closed by :meth:`stop_all`."""
        if self._http is None or self._http.is_closed:
            self._http = new_async_client(HEALTH_PROBE)
        return self._http

    def _record_run(
        self,
        input: RunHarnessInput,
        runtime: Runtime,
        adapter: HarnessAdapter,
        proc: RuntimeProcess,
        end: _RunEnd,
        duration: float,
    ) -> RunHarnessOutput:
        """Store the run's ``harness`` artifact (exit, output, the adapter's summary) and
        return the activity's output."""
        stdout_path, stderr_path = proc.stdout_path, proc.stderr_path
        exit_code = end.exit_code
        out, err = _tail(stdout_path), _tail(stderr_path)
        stdout = _tail(stdout_path, 1 << 20)
        self.store.put_json(
            artifact_key(input.session_id, "harness"),
            {
                "exit_code": exit_code,
                "timed_out": end.timed_out,
                "duration_s": duration,
                "stdout": stdout[-64_000:],
                "stderr": _tail(stderr_path, 64_000),
                "summary": adapter.summarize(stdout),
                # processes the memory limit killed during the run (the harness or its tools)
                "num_oom_kills": runtime.num_oom_kills,
            },
        )
        log.info(
            "harness_finished",
            exit_code=exit_code,
            timed_out=end.timed_out,
            duration_s=round(duration, 3),
            num_oom_kills=runtime.num_oom_kills,
        )
        return RunHarnessOutput(
            exit_code=exit_code,
            timed_out=end.timed_out,
            duration_s=duration,
            stdout_tail=out,
            stderr_tail=err,
            timed_out_at=end.timed_out_at,
            # terminate() sends SIGTERM, then SIGKILL after its grace
            signal_sent=(
                -exit_code
                if end.timed_out and exit_code is not None and exit_code < 0
                else end.signal_sent
            ),
            num_oom_kills=runtime.num_oom_kills,
            backend_verdict=end.backend_verdict,
            limit_reached=end.limit_reached,
        )

    async def _drain_run(self, proc: RuntimeProcess, runtime_id: str, elapsed_s: float) -> None:
        """Stop a harness run because the host drains: the harness's process group gets
        SIGTERM then SIGKILL (the cancellation's short grace), its runtime is torn down, and
        ``HostDrainingError`` goes back to the session. Its completions are in the log
        already (each is recorded before it is answered), so the next attempt replays them."""
        await proc.terminate(grace_s=CANCEL_GRACE_S)
        await self._hand_back(runtime_id)
        self.num_handed_back += 1
        log.warning("harness_handed_back", runtime_id=runtime_id, elapsed_s=round(elapsed_s, 3))
        raise to_application_error(
            self._draining_error(f"harness run handed back after {elapsed_s:.1f} s")
        )

    @activity.defn(name=COLLECT_ARTIFACTS)
    async def collect_artifacts(self, input: CollectArtifactsInput) -> CollectArtifactsOutput:
        """Collect a runtime's artifacts into the blob store, and run the evaluator's check.

        In the session's runtime (``collect_outputs``): ``patch`` (``git diff --binary`` of a
        git workspace, ``spec.git_diff``) and each ``spec.artifacts`` file as ``file:{path}``.
        In an evaluation runtime (``apply_patch_ref`` set): that patch is applied first, as
        ``patch_apply``. Then, when ``run_check``: the evaluator's in-runtime step (its
        ``collect(runtime, ...)`` if it has one, else ``spec.command``) as ``check``.
        """
        structlog.contextvars.bind_contextvars(session_id=input.session_id)
        artifacts = {"harness": artifact_key(input.session_id, "harness")}
        try:
            runtime = self._runtime(input.runtime_id)
            async with heartbeating(phase="collect"):
                artifacts |= await self._collect(runtime, input)
        except Exception as e:
            raise to_application_error(e) from e
        return CollectArtifactsOutput(artifacts=artifacts)

    async def _collect(self, runtime: Runtime, input: CollectArtifactsInput) -> dict[str, str]:
        """The body of :meth:`collect_artifacts`; returns name -> blob key.

        A path the runtime's processes made unsafe to open (:class:`PathRefusedError`) does
        not fail the step: it is recorded (:mod:`rolloutd.activities.refused`) and scored as
        the policy's doing; the evaluator's check does not run after one.
        """
        artifacts: dict[str, str] = {}
        refused: list[TamperFinding] = []
        if input.collect_outputs:
            artifacts |= await self._collect_outputs(runtime, input.session_id, refused)
            if input.store_final_state:
                # before the check, which may write into the workspace
                await store_final_state(
                    runtime,
                    self.store,
                    session_id=input.session_id,
                    evaluator=input.evaluator,
                    parts=final_state_parts(input.evaluator),
                    max_bytes=self.settings.max_final_state_bytes,
                    patch_key=artifacts.get("patch"),
                )
                artifacts["final_state"] = final_state_key(input.session_id)
        applied_ok = True
        if input.apply_patch_ref:
            patch = self.store.get_json(input.apply_patch_ref)
            result = await apply_patch(runtime, str(patch.get("patch") or ""))
            key = artifact_key(input.session_id, "patch_apply")
            self.store.put_json(
                key, result.model_dump(include={"exit_code", "stdout", "stderr", "timed_out"})
            )
            artifacts["patch_apply"] = key
            applied_ok = result.exit_code == 0
            log.info("patch_applied", exit_code=result.exit_code)
        if input.run_check and applied_ok and not refused:
            try:
                check = await run_check(runtime, input.evaluator)
            except PathRefusedError as e:
                log.warning("collect_path_refused", path=e.path, error=e.message)
                refused.append(refused_finding(e))
                check = None
            if check is not None:
                key = artifact_key(input.session_id, CHECK_ARTIFACT)
                self.store.put_json(key, check)
                artifacts[CHECK_ARTIFACT] = key
                log.info(
                    "check_finished",
                    exit_code=check.get("exit_code"),
                    timed_out=check.get("timed_out"),
                )
        if refused:
            name = REFUSED_PATHS_ARTIFACT + ("" if input.collect_outputs else ":check")
            key = artifact_key(input.session_id, name)
            report = TamperReport(
                findings=refused[:MAX_FINDINGS],
                num_changed_paths=len(refused),
                truncated=len(refused) > MAX_FINDINGS,
            )
            self.store.put_json(key, report)
            artifacts[name] = key
        return artifacts

    async def _collect_outputs(
        self, runtime: Runtime, session_id: str, refused: list[TamperFinding]
    ) -> dict[str, str]:
        """Store the workspace's patch and the spec's artifact files; return name -> key.
        A file the worker refused to open is stored as ``{"path", "refused"}`` and added to
        ``refused``."""
        artifacts: dict[str, str] = {}
        if runtime.spec.git_diff:
            patch = await git_patch(runtime)
            if patch is not None:
                key = artifact_key(session_id, "patch")
                self.store.put_json(key, patch)
                artifacts["patch"] = key
        for path in runtime.spec.artifacts:
            name = f"file:{path}"
            try:
                # read in chunks up to the limit; a larger file fails the session
                data = await runtime.download(path, max_bytes=self.settings.max_artifact_bytes)
                value = {
                    "path": path,
                    "text": data.decode("utf-8", errors="replace"),
                    "num_bytes": len(data),
                }
            except NotFoundError:
                value = {"path": path, "missing": True}
            except PathRefusedError as e:
                log.warning("collect_path_refused", path=path, error=e.message)
                refused.append(refused_finding(e, path))
                value = {"path": path, "refused": e.message}
            key = artifact_key(session_id, f"file:{artifact_file_name(path)}")
            self.store.put_json(key, value)
            artifacts[name] = key
        return artifacts

    @activity.defn(name=RESTORE_FINAL_STATE)
    async def restore_final_state(self, input: RestoreFinalStateInput) -> RestoreFinalStateOutput:
        """Restore a session's stored final state into a runtime of this host provisioned for
        a re-score, before anything runs in it (:mod:`rolloutd.sandbox.final_state`)."""
        structlog.contextvars.bind_contextvars(session_id=input.session_id)
        try:
            runtime = self._runtime(input.runtime_id)
            state = await asyncio.to_thread(self.store.get_model, input.final_state_key, FinalState)
            async with heartbeating(phase="restore"):
                await restore_final_state(runtime, self.store, state)
        except Exception as e:
            raise to_application_error(e) from e
        return RestoreFinalStateOutput(image_digest=image_digest(runtime))

    @activity.defn(name=TEARDOWN_RUNTIME)
    async def teardown_runtime(self, input: TeardownRuntimeInput) -> TeardownRuntimeOutput:
        """Stop the runtime: every process killed, workspace removed. Idempotent."""
        t0 = time.monotonic()
        runtime = self.runtimes.pop(input.runtime_id, None)
        if runtime is None:
            return TeardownRuntimeOutput(found=False)
        try:
            async with heartbeating(phase="teardown"):
                await runtime.stop()
        except Exception as e:
            self.runtimes[input.runtime_id] = runtime
            raise to_application_error(e) from e
        reclaim.release(self.root, input.runtime_id)
        self.on_runtime_gone()
        duration = time.monotonic() - t0
        log.info("runtime_stopped", runtime_id=input.runtime_id, duration_s=round(duration, 4))
        return TeardownRuntimeOutput(found=True, duration_s=duration)

    async def stop_all(self) -> None:
        """Tear down every runtime of this host and its warm pool (worker shutdown)."""
        if self.pool is not None:
            await self.pool.close()
        for runtime_id in list(self.runtimes):
            await self.teardown_runtime(TeardownRuntimeInput(runtime_id=runtime_id))
        if self._http is not None:
            await self._http.aclose()


#: characters of a session id kept in a runtime id: the runtime's folder holds a unix socket
#: (bwrap ``network: gateway``), and a socket path must fit in 108 bytes (unix(7)).
RUNTIME_ID_SESSION_CHARS = 24


def _short(name: str) -> str:
    """``name``, or its head and a digest of the whole when longer than
    :data:`RUNTIME_ID_SESSION_CHARS`."""
    if len(name) <= RUNTIME_ID_SESSION_CHARS:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: RUNTIME_ID_SESSION_CHARS - 9]}~{digest}".replace("~", "_")


def _tail(path: Path, limit: int = TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
