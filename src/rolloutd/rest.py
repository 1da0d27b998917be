"""REST facade for trainers that do not speak Temporal (FastAPI; OpenAPI at ``/openapi.json``).

POLAR-compatible task routes (Polar, arXiv 2605.24220; wire models of its rollout service,
NVIDIA-NeMo/ProRL-Agent-Server ``src/polar/rollout/{models,server}.py``)::

    POST   /rollout/task/submit     Polar TaskRequest -> {"task_id", "status": "running"}
    GET    /rollout/task/{task_id}  Polar TaskStatus: status, total/completed sessions, results
                                    (``?traces=false``: each result without its traces)
    DELETE /rollout/task/{task_id}  cancel; the TaskStatus after cancellation was requested
    GET    /rollout/status          counts of running tasks and buffers

rolloutd's own task routes (``rolloutd tasks`` calls them with a tenant token)::

    GET    /rollout/tasks                          tasks, newest first (``status``, ``prefix``,
                                                   ``limit``): ``{"tasks": [TaskRow, ...]}``
    GET    /rollout/session/{session_id}/trajectory  an ended session's Trajectory (its
                                                   evaluation record and re-scores included)

Every route needs ``Authorization: Bearer <ROLLOUTD_REST_TOKEN>`` when the token is set;
without one the facade serves on a loopback address only, and refuses the backend calls.

ProRL Agent-compatible backend calls (arXiv 2603.18815; ``add_llm_server(address)``), forwarded
to the gateway's admin routes::

    POST /add_llm_server    {"address": URL, "type"?: ..., "name"?: ...}
    POST /clear_llm_server

The trace viewer's pages (:mod:`rolloutd.viewer`; ``rolloutd view ID`` opens them)::

    GET /view/task/{task_id}         the task and its group of sessions (HTML)
    GET /view/session/{session_id}   a session's completions and traces, token by token (HTML)

A Polar request maps onto rolloutd's TaskRequest field by field (the table is docs/polar.md,
:data:`POLAR_PATHS` its code). A submit goes through the trainer client, so what no registered
host can run (a harness without an adapter or CLI, an unknown evaluator, an evaluator import
path that does not import on an eval host) is refused with 422 naming the Polar field (e.g.
``evaluator.strategy``) before any workflow starts; this process never imports a module a
request names. The status comes from the client too (queries and results, never raw history):
each session's outcome as soon as it ends, ``completed``/``failed`` as soon as every session
ended, and each session's callback (``delivered``, ``pending`` or ``failed``, attempts, error).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field
from temporalio.exceptions import WorkflowAlreadyStartedError

from rolloutd.errors import ConfigError, FleetRegistryError, NotFoundError
from rolloutd.polar import (
    SESSION_STATUS,
    PolarTaskRequest,
    polar_path,
    to_task_request,
    unknown_polar_fields,
)
from rolloutd.scoring import failure_counts
from rolloutd.security.exposure import require_token_off_loopback
from rolloutd.security.tenants import OPERATOR, Caller, TenantTokens, resolve_caller
from rolloutd.settings import RestSettings, default_home, find_admin_token
from rolloutd.stack.inflight import sessions_by_phase
from rolloutd.trainer_client.admin import AdminError, BackendAdmin
from rolloutd.trainer_client.client import InvalidTaskError, RolloutClient
from rolloutd.trainer_client.health import FleetHealth
from rolloutd.types import (
    DEFAULT_FAIRNESS_WEIGHT,
    DEFAULT_PRIORITY,
    CallbackStatus,
    SessionResult,
    TaskProgress,
)
from rolloutd.viewer import add_viewer_routes


class SubmitResponse(BaseModel):
    task_id: str
    status: str
    #: the key this task's callbacks are signed with (``X-Rolloutd-Signature``;
    #: rolloutd.security.callbacks.verify_callback); None without a callback_url
    callback_secret: str | None = None


class PolarTaskStatus(BaseModel):
    """Polar's ``TaskStatus``: ``status`` is running, completed or failed; ``completed_sessions``
    counts the sessions that ended, each in ``results`` as soon as it ended. rolloutd adds
    ``error`` (why a task failed), ``callback`` (all sessions' callbacks at once: ``status``
    failed / pending / delivered, ``attempts``, ``error``; each session's own in its result)
    and ``failures`` (the ended sessions by failure kind, ``none`` for those that ran to their
    end; each session's cause is its result's ``failure``, docs/failures.md)."""

    task_id: str
    status: str
    total_sessions: int
    completed_sessions: int
    results: list[dict[str, Any]] = Field(default_factory=list)
    result_paths: list[str] = Field(default_factory=list)
    error: str | None = None
    failures: dict[str, int] = Field(default_factory=dict)
    callback: dict[str, Any] | None = None


class AddLLMServer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: str
    type: str = "llama_cpp"
    name: str | None = None


def _with_callbacks(progress: TaskProgress) -> list[tuple[SessionResult, CallbackStatus | None]]:
    """Each ended session with its callback's status (None without a callback)."""
    callbacks = {c.session_id: c for c in progress.callbacks}
    return [(s, callbacks.get(s.session_id)) for s in progress.sessions]


def _callback_summary(progress: TaskProgress) -> dict[str, Any] | None:
    """All sessions' callbacks at once: ``failed`` when one failed, else ``pending`` while
    one is pending, else ``delivered``; attempts summed; the first error."""
    if not progress.callbacks:
        return None
    states = {c.status for c in progress.callbacks}
    status = next(s for s in ("failed", "pending", "delivered") if s in states)
    errors = [c.error for c in progress.callbacks if c.error and c.status == status]
    return {
        "status": status,
        "attempts": sum(c.attempts for c in progress.callbacks),
        "error": errors[0] if errors else None,
    }


def _session_body(
    client: RolloutClient,
    session: SessionResult,
    callback: CallbackStatus | None = None,
    traces_too: bool = True,
) -> dict[str, Any]:
    """A Polar-shaped SessionResult: status, reward, error, trajectory (traces when the store
    is reachable and ``traces_too``), timing in ms, its callback, plus rolloutd's own summary
    under ``metadata.rolloutd``."""
    status = SESSION_STATUS[session.status]
    failure = session.failure.model_dump(mode="json") if session.failure else None
    traces: list[dict[str, Any]] = []
    trajectory_meta: dict[str, Any] = {"builder": "", "stats": session.stats.model_dump()}
    if traces_too and client.store is not None and session.trajectory_ref:
        trajectory = client.trajectory(session)
        traces = [t.model_dump(mode="json") for t in trajectory.traces]
        trajectory_meta["builder"] = trajectory.builder
    timing = {f"{p.phase}_ms": p.duration_s * 1000 for p in session.phases}
    return {
        "session_id": session.session_id,
        "task_id": session.task_id,
        "status": status,
        "reward": session.reward,
        "error": session.error,
        "failure": failure,
        "callback": callback.model_dump(mode="json") if callback is not None else None,
        "trajectory": {
            "status": status,
            "metadata": trajectory_meta,
            "traces": traces,
            "error": session.error,
            "failure": failure,
        },
        "timing": timing,
        "node_id": None,
        "metadata": {"rolloutd": session.model_dump(mode="json", exclude={"phases", "stats"})},
    }


#: the default bound of a request body, bytes: a task request travels in Temporal payloads,
#: whose default limit is 2 MB (Temporal docs, "Temporal Platform limits": blob size)
DEFAULT_MAX_BODY_BYTES = 2**20


class BodyLimit:
    """ASGI middleware: a request body larger than ``max_body_bytes`` gets 413 in FastAPI's
    error shape (``{"detail": ...}``) before any route reads it, whether it declares its
    length (``Content-Length``) or is sent in chunks (counted as it arrives, then handed to
    the app whole). RFC 9110, section 15.5.14 (413 Content Too Large).

    Args:
        app: the ASGI app.
        max_body_bytes: the bound, bytes.
    """

    def __init__(self, app: Any, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def _too_large(self, send: Any) -> None:
        body = json.dumps(
            {"detail": f"the request body exceeds the limit of {self.max_body_bytes} bytes"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit():
                if int(value) > self.max_body_bytes:
                    await self._too_large(send)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away: the app sees it as it would have
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                await self._too_large(send)
                return
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        delivered = False

        async def replay() -> Any:
            nonlocal delivered
            if not delivered:
                delivered = True
                return whole
            return await receive()

        await self.app(scope, replay, send)


def authenticate(token: str | None, tenants: TenantTokens) -> Callable[[Request], None]:
    """A FastAPI dependency: who the request's bearer token names (:class:`Caller`, kept in
    ``request.state.caller``): the operator (the facade's token; anyone on a facade with no
    token at all, which serves on loopback only) or a tenant (its tenant token).

    Raises:
        HTTPException: 401 without a token where one is needed, or with an unknown one.
    """

    def check(request: Request) -> None:
        header = request.headers.get("authorization", "")
        sent = header[7:].strip() if header.lower().startswith("bearer ") else ""
        caller = resolve_caller(sent, [token], tenants)
        if caller is None:
            raise HTTPException(
                401,
                detail="this REST facade needs `Authorization: Bearer <token>` (the facade's "
                "ROLLOUTD_REST_TOKEN, or a tenant token)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        request.state.caller = caller

    return check


def caller_of(request: Request) -> Caller:
    """The request's caller (set by :func:`authenticate`)."""
    return getattr(request.state, "caller", OPERATOR)


def require_operator(request: Request) -> None:
    """A route dependency: only the operator (403 for a tenant token)."""
    if not caller_of(request).operator:
        raise HTTPException(403, detail="this route needs the operator's token, not a tenant's")


def _claims_more(field: str, message: str) -> HTTPException:
    """The 403 of a submission that claims more than its tenant token allows, naming the
    field as a validation error does."""
    return HTTPException(403, detail=[{"loc": [field], "msg": message}])


def claim_tenant(task: dict[str, Any], caller: Caller) -> None:
    """Bind a submitted task to the caller's tenant and its token's bounds: a tenant token
    submits for its own tenant only, at its maximum priority or lower (a larger number) and
    at its maximum fairness weight or below; an absent priority or weight above the bound is
    lowered to it.

    Raises:
        HTTPException: 403 naming ``tenant``, ``priority`` or ``fairness_weight`` when the
            body claims more.
    """
    if caller.operator:
        return
    claimed = task.get("tenant")
    if claimed is not None and claimed != caller.tenant:
        raise _claims_more(
            "tenant", f"the token is tenant {caller.tenant!r}'s; it cannot submit for {claimed!r}"
        )
    task["tenant"] = caller.tenant
    priority = task.get("priority")
    if priority is not None and isinstance(priority, int) and priority < caller.max_priority:
        raise _claims_more(
            "priority",
            f"priority {priority} is above tenant {caller.tenant!r}'s maximum "
            f"({caller.max_priority}; 1 is served first)",
        )
    if priority is None:
        task["priority"] = max(DEFAULT_PRIORITY, caller.max_priority)
    weight = task.get("fairness_weight")
    if isinstance(weight, int | float) and weight > caller.max_fairness_weight:
        raise _claims_more(
            "fairness_weight",
            f"fairness_weight {weight:g} is above tenant {caller.tenant!r}'s maximum "
            f"({caller.max_fairness_weight:g})",
        )
    if weight is None:
        task["fairness_weight"] = min(DEFAULT_FAIRNESS_WEIGHT, caller.max_fairness_weight)


def create_app(
    client: RolloutClient,
    *,
    gateway_url: str | None = None,
    admin_token: str | None = None,
    callback_timeout_s: float | None = None,
    token: str | None = None,
    tenant_tokens: TenantTokens | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The facade's app.

    Args:
        client: a connected RolloutClient (with ``store_url`` to return traces).
        gateway_url, admin_token: the gateway whose admin routes the backend calls use.
        callback_timeout_s: total time of one session's callback (``TaskRequest``'s default
            when None; ``ROLLOUTD_CALLBACK_TIMEOUT_S`` for ``rolloutd rest``).
        token: the facade's bearer token (``ROLLOUTD_REST_TOKEN``), the operator's: every
            route but the OpenAPI pages needs it or a tenant token (401 otherwise). None and
            no tenant tokens: the task routes are open (a loopback-only facade,
            :func:`serve`) and the backend routes answer 403, since they are forwarded only
            for callers holding the token.
        tenant_tokens: the tenants' tokens (``ROLLOUTD_TENANT_TOKENS_FILE``): a tenant
            submits for itself only, within its maximum priority, and sees, reads, views and
            cancels only its own tasks (another tenant's task answers 404, as an unknown
            one); the backend and stack routes need the operator's token (403).
        max_body_bytes: a larger request body gets 413 (:class:`BodyLimit`;
            ``ROLLOUTD_REST_MAX_BODY_BYTES`` for ``rolloutd rest``).
    """
    tenants = tenant_tokens or TenantTokens()
    app = FastAPI(
        title="rolloutd REST facade",
        version="0.1.0",
        description="POLAR- and ProRL-compatible rollout API over rolloutd.",
        dependencies=[Depends(authenticate(token or None, tenants))],
    )

    async def authorize(request: Request, task_id: str) -> None:
        caller = caller_of(request)
        if caller.operator:
            return
        try:
            owner = await client.task_tenant(task_id)
        except NotFoundError:
            raise HTTPException(404, detail="Task not found") from None
        if not caller.may_see(owner):
            raise HTTPException(404, detail="Task not found")

    app.state.authorize_task = authorize
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    _task_routes(app, client, callback_timeout_s, authorize)
    _backend_routes(app, gateway_url, admin_token, token)
    return app


def _task_routes(
    app: FastAPI,
    client: RolloutClient,
    callback_timeout_s: float | None,
    authorize: Callable[[Request, str], Any],
) -> None:
    """POLAR's task routes: submit, status, cancel, and how many tasks and buffers run; a
    tenant's only its own (``authorize``)."""

    async def status_of(task_id: str, traces: bool = True) -> PolarTaskStatus:
        try:
            progress = await client.status(task_id)
        except NotFoundError:
            raise HTTPException(404, detail="Task not found") from None
        # every session's trajectory is read from the store: off the event loop
        results = await asyncio.to_thread(
            lambda: [_session_body(client, s, c, traces) for s, c in _with_callbacks(progress)]
        )
        return PolarTaskStatus(
            task_id=task_id,
            status="running"
            if progress.status == "running"
            else "completed"
            if progress.status == "completed"
            else "failed",
            total_sessions=progress.num_samples,
            completed_sessions=len(results),
            results=results,
            error=progress.error,
            callback=_callback_summary(progress),
            failures=failure_counts(progress.sessions, count_none=True),
        )

    @app.post("/rollout/task/submit", response_model=SubmitResponse)
    async def submit(request: PolarTaskRequest, http: Request) -> SubmitResponse:
        """Non-blocking submission; poll ``GET /rollout/task/{task_id}``."""
        unknown = unknown_polar_fields(request)
        if unknown:
            raise HTTPException(
                422,
                detail=[
                    {"loc": path.split("."), "msg": f"unknown field {path!r}"} for path in unknown
                ],
            )
        try:
            task = to_task_request(request)
            claim_tenant(task, caller_of(http))
            if callback_timeout_s is not None:
                task["callback_timeout_s"] = callback_timeout_s
            handle = await client.submit(task)
        except InvalidTaskError as e:
            raise HTTPException(
                422, detail=[{"loc": polar_path(p).split("."), "msg": m} for p, m in e.errors]
            ) from None
        except FleetRegistryError as e:
            raise HTTPException(503, detail=str(e)) from None
        except WorkflowAlreadyStartedError:
            raise HTTPException(409, detail=f"task {request.task_id} exists") from None
        return SubmitResponse(
            task_id=handle.task_id,
            status="running",
            callback_secret=handle.task.callback_secret,
        )

    @app.get("/rollout/task/{task_id}", response_model=PolarTaskStatus)
    async def get_task(task_id: str, http: Request, traces: bool = True) -> PolarTaskStatus:
        """The task's status and every ended session's result (``traces=false``: without
        the trajectories' traces, which are read from the store otherwise)."""
        await authorize(http, task_id)
        return await status_of(task_id, traces)

    @app.get("/rollout/tasks")
    async def list_tasks(
        http: Request, status: str | None = None, prefix: str | None = None, limit: int = 100
    ) -> dict[str, Any]:
        """Tasks, newest first, from Temporal's visibility (no task is queried): a tenant's
        token lists its own tenant's only. 422 for a malformed filter."""
        caller = caller_of(http)
        try:
            rows = await client.list_tasks(
                status=status,
                prefix=prefix,
                tenant=None if caller.operator else caller.tenant,
                limit=limit,
            )
        except ConfigError as e:
            raise HTTPException(422, detail=str(e)) from None
        return {"tasks": [row.model_dump(mode="json") for row in rows]}

    @app.get("/rollout/session/{session_id:path}/trajectory")
    async def get_trajectory(session_id: str, http: Request) -> dict[str, Any]:
        """An ended session's trajectory: traces, reward, failure cause, evaluation record
        (tamper report included) and later re-scores. 404 for a session that has not ended
        or is not the caller's; 503 without a blob store."""
        task_id = session_id.split("/", 1)[0]  # task ids hold no "/"
        await authorize(http, task_id)
        try:
            progress = await client.status(task_id)
        except NotFoundError:
            raise HTTPException(404, detail="Task not found") from None
        session = next(
            (s for s in [*progress.sessions, *progress.replaced] if s.session_id == session_id),
            None,
        )
        if session is None or not session.trajectory_ref:
            raise HTTPException(404, detail=f"session {session_id} has no trajectory (yet)")
        if client.store is None:
            raise HTTPException(503, detail="the facade has no blob store (--store-url)")
        trajectory = await asyncio.to_thread(client.trajectory, session)
        return trajectory.model_dump(mode="json")

    @app.delete("/rollout/task/{task_id}", response_model=PolarTaskStatus)
    async def cancel_task(task_id: str, http: Request) -> PolarTaskStatus:
        """Cancel a task: its sessions stop and tear down."""
        await authorize(http, task_id)
        current = await status_of(task_id)
        if current.status == "running":
            await client.cancel(task_id)
        return current

    # one checker for the facade's life: a fleet never seen counts from its first look
    health = client.fleet_health or FleetHealth(client.client)

    @app.get("/rollout/status")
    async def rollout_status(http: Request) -> dict[str, Any]:
        """How many tasks and buffers run, and whether each fleet lives
        (:func:`rolloutd.capabilities.fleet_liveness`: a worker process beat in the fleet
        registry within 45 s; a full fleet beats, so it is alive). ``fleets`` is empty when
        Temporal did not answer. A tenant's token counts its own running tasks (search
        attribute ``RolloutTenant``) and no buffers (the operator runs those)."""
        caller = caller_of(http)
        count = client.client.count_workflows
        running_tasks = "WorkflowType='RolloutTaskWorkflow' AND ExecutionStatus='Running'"
        if not caller.operator:
            # a tenant name is a task id's characters (check_tenant): safe in the query
            running_tasks += f" AND RolloutTenant='{caller.tenant}'"
        out: dict[str, Any] = {"status": "ok", "running_tasks": (await count(running_tasks)).count}
        if caller.operator:
            buffers = "WorkflowType='RolloutBufferWorkflow' AND ExecutionStatus='Running'"
            out["running_buffers"] = (await count(buffers)).count
        else:
            out["tenant"] = caller.tenant
        fleets = await health.liveness()
        out["fleets"] = {name: f.model_dump() for name, f in fleets.items()}
        return out


def _backend_routes(
    app: FastAPI, gateway_url: str | None, admin_token: str | None, token: str | None
) -> None:
    """ProRL Agent's backend routes, forwarded to the gateway's admin API, for callers holding
    the facade's token only."""

    def admin() -> BackendAdmin:
        if not token:
            raise HTTPException(
                403,
                detail="backend calls are forwarded only for callers "
                "holding the facade's token; start it with ROLLOUTD_REST_TOKEN",
            )
        if not gateway_url:
            raise HTTPException(503, detail="no gateway configured (--gateway-url)")
        return BackendAdmin(gateway_url, admin_token)

    @app.post("/add_llm_server", dependencies=[Depends(require_operator)])
    async def add_llm_server(body: AddLLMServer) -> dict[str, Any]:
        """ProRL Agent's backend registration, forwarded to the gateway's pool."""
        async with admin() as a:
            try:
                added = await a.add(body.address, type=body.type, name=body.name)
            except AdminError as e:
                raise HTTPException(e.status_code, detail=str(e)) from None
        return {"status": "ok", "backend": added}

    @app.post("/clear_llm_server", dependencies=[Depends(require_operator)])
    async def clear_llm_server() -> dict[str, Any]:
        """ProRL Agent's pool reset, forwarded to the gateway."""
        async with admin() as a:
            try:
                await a.clear()
            except AdminError as e:
                raise HTTPException(e.status_code, detail=str(e)) from None
        return {"status": "ok"}


def serve(
    address: str,
    store_url: str | None,
    host: str,
    port: int,
    gateway_url: str | None,
) -> None:
    """Entry point of ``rolloutd rest``: serve the facade with uvicorn until interrupted.

    The facade's token is ``ROLLOUTD_REST_TOKEN`` (:class:`RestSettings`); the gateway's admin
    token, which the backend calls send, is ``ROLLOUTD_ADMIN_TOKEN`` or the one ``rolloutd
    up`` generated (:func:`rolloutd.settings.find_admin_token`): tokens never go on a command
    line, where ``ps`` shows them to every user of the machine.

    Raises:
        ConfigError: ``host`` is not loopback and no token is set (before connecting).
    """
    import uvicorn

    settings = RestSettings()
    tenants = TenantTokens.load(settings.tenant_tokens_file)
    require_token_off_loopback(
        host,
        settings.rest_token or ("tenant tokens" if tenants else None),
        service="the REST facade",
        token_setting="ROLLOUTD_REST_TOKEN",
        protects="its task routes (submit, cancel, results) and backend calls",
    )

    async def main() -> None:
        client = await RolloutClient.connect(
            address, namespace=settings.temporal_namespace, store_url=store_url
        )
        app = create_app(
            client,
            gateway_url=gateway_url,
            admin_token=find_admin_token(),
            callback_timeout_s=settings.callback_timeout_s,
            token=settings.rest_token,
            tenant_tokens=tenants,
            max_body_bytes=settings.rest_max_body_bytes,
        )
        add_stack_status_route(app, client, default_home())
        add_viewer_routes(
            app,
            client,
            default_model=settings.viewer_model,
            authorize=app.state.authorize_task,
            tenant_of=lambda request: (
                None if caller_of(request).operator else caller_of(request).tenant
            ),
        )
        await uvicorn.Server(uvicorn.Config(app, host=host, port=port)).serve()

    asyncio.run(main())


def add_stack_status_route(app: FastAPI, client: RolloutClient, home: Path) -> None:
    """``GET /stack/status``: what ``rolloutd status`` shows, for callers without a shell on
    the machine: the state file ``rolloutd up`` keeps in ``home`` (each child's pid, start
    time, restarts, last exit, task queues; the engine's model, policy version and slots)
    and the sessions in flight by phase.

    Args:
        app: the facade's app.
        client: its Temporal client.
        home: the stack's home (``$ROLLOUTD_HOME``).

    Responses:
        200 ``{"state": {...}, "sessions_by_phase": {"run": 3, ...}}``; 404 when no stack has
        run on ``home``.
    """

    @app.get("/stack/status", dependencies=[Depends(require_operator)])
    async def stack_status() -> dict[str, Any]:
        try:  # the name rolloutd.stack.state.STATE_FILE: the stack is this module's sibling
            state = json.loads((home / "stack.json").read_text())
        except FileNotFoundError:
            raise HTTPException(404, f"no stack has run on {home}") from None
        return {"state": state, "sessions_by_phase": await sessions_by_phase(client.client)}
