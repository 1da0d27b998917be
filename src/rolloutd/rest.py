"""REST facade for trainers that do not speak Temporal (FastAPI; OpenAPI at ``/openapi.json``).

POLAR-compatible task routes (Polar, arXiv 2605.24220; wire models of its rollout service,
NVIDIA-NeMo/ProRL-Agent-Server ``src/polar/rollout/{models,server}.py``)::

    POST   /rollout/task/submit     Polar TaskRequest -> {"task_id", "status": "running"}
    GET    /rollout/task/{task_id}  Polar TaskStatus: status, total/completed sessions, results
    DELETE /rollout/task/{task_id}  cancel; the TaskStatus after cancellation was requested
    GET    /rollout/status          counts of running tasks and buffers

ProRL Agent-compatible backend calls (arXiv 2603.18815; ``add_llm_server(address)``), forwarded
to the gateway's admin routes::

    POST /add_llm_server    {"address": URL, "type"?: ..., "name"?: ...}
    POST /clear_llm_server

A Polar request maps onto rolloutd's TaskRequest: ``timeout_seconds`` -> ``timeout_s``,
``runtime.backend`` -> ``runtime.type`` (local, bwrap, apptainer, docker), ``agent.harness`` ->
``harness.type`` with ``agent.settings`` (``command``, ``args``, ``max_turns``, ``profile``) and
``agent.env``, ``agent.model_name`` -> ``model``, ``builder.strategy`` -> ``builder.type``,
``evaluator.strategy`` -> ``evaluator.type`` with ``evaluator.config`` (``command``,
``expected_output``, ``timeout_s``; other keys become ``params``). Polar fields rolloutd has no
use for (``dispatch_priority``, ``early_stop_min_usable_sessions``, ``agent.import_path``, ...)
are accepted; ``agent.import_path`` is refused (rolloutd runs registered harnesses only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from rolloutd.trainer_client.admin import AdminError, BackendAdmin
from rolloutd.settings import default_home
from rolloutd.trainer_client.client import InvalidTaskError, RolloutClient
from rolloutd.trainer_client.inflight import sessions_by_phase
from rolloutd.types import SessionResult, SessionStatus, TaskResult


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class PolarRuntime(_Wire):
    backend: str = "local"
    image: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    network: str | None = None
    workdir: str | None = None
    memory_mb: int | None = None


class PolarAgent(_Wire):
    harness: str | None = None
    import_path: str | None = None
    model_name: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)


class PolarStrategy(_Wire):
    strategy: str
    config: dict[str, Any] = Field(default_factory=dict)


class PolarTaskRequest(_Wire):
    """Polar's ``TaskRequest`` (``src/polar/rollout/models.py``); unknown fields are kept."""

    task_id: str
    instruction: str
    num_samples: int = Field(default=1, ge=1)
    timeout_seconds: float = Field(default=600.0, gt=0)
    runtime: PolarRuntime | None = None
    agent: PolarAgent
    builder: PolarStrategy | None = None
    evaluator: PolarStrategy | None = None
    callback_url: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class SubmitResponse(BaseModel):
    task_id: str
    status: str


class PolarTaskStatus(BaseModel):
    """Polar's ``TaskStatus``: ``status`` is running, completed or failed."""

    task_id: str
    status: str
    total_sessions: int
    completed_sessions: int
    results: list[dict[str, Any]] = Field(default_factory=list)
    result_paths: list[str] = Field(default_factory=list)


class AddLLMServer(_Wire):
    address: str
    type: str = "llama_cpp"
    name: str | None = None


_NETWORKS = {"host": "host", "none": "none", "gateway": "gateway", None: None}
_SESSION_STATUS = {SessionStatus.COMPLETED: "COMPLETED", SessionStatus.FAILED: "ERROR",
                   SessionStatus.TIMEOUT: "TIMEOUT", SessionStatus.CANCELLED: "ERROR"}


def to_task_request(polar: PolarTaskRequest) -> dict[str, Any]:
    """A rolloutd TaskRequest (as a dict, validated by the client) from a Polar request.

    Raises:
        InvalidTaskError: a field rolloutd cannot honour (named by its Polar path).
    """
    agent = polar.agent
    if agent.import_path or not agent.harness:
        raise InvalidTaskError([("agent.harness", "a registered harness name is required; "
                                 "agent.import_path is not supported")])
    settings = agent.settings
    harness = {"type": agent.harness, "env": agent.env,
               **{k: settings[k] for k in ("command", "args", "max_turns", "profile")
                  if k in settings}}
    task: dict[str, Any] = {
        "task_id": polar.task_id, "instruction": polar.instruction,
        "num_samples": polar.num_samples, "timeout_s": polar.timeout_seconds,
        "harness": harness, "metadata": polar.metadata, "callback_url": polar.callback_url,
    }
    if agent.model_name:
        task["model"] = agent.model_name
    if polar.runtime is not None:
        rt = polar.runtime
        runtime: dict[str, Any] = {"type": rt.backend, "image": rt.image, "env": rt.env,
                                   "memory_mb": rt.memory_mb}
        if rt.workdir:
            runtime["workdir"] = rt.workdir
        if rt.network in _NETWORKS and rt.network is not None:
            runtime["network"] = rt.network
        task["runtime"] = runtime
    if polar.builder is not None:
        task["builder"] = {"type": polar.builder.strategy,
                           **{k: v for k, v in polar.builder.config.items()
                              if k in ("on_drift", "loss_mask")}}
    if polar.evaluator is not None:
        config = dict(polar.evaluator.config)
        task["evaluator"] = {"type": polar.evaluator.strategy,
                             **{k: config.pop(k) for k in ("command", "expected_output",
                                                           "timeout_s") if k in config},
                             "params": config}
    return task


def _session_body(client: RolloutClient, session: SessionResult) -> dict[str, Any]:
    """A Polar-shaped SessionResult: status, trajectory (traces when the store is reachable),
    timing in ms, plus rolloutd's own summary under ``metadata.rolloutd``."""
    status = _SESSION_STATUS[session.status]
    traces: list[dict[str, Any]] = []
    trajectory_meta: dict[str, Any] = {"builder": "", "stats": session.stats.model_dump()}
    if client.store is not None and session.trajectory_ref:
        trajectory = client.trajectory(session)
        traces = [t.model_dump(mode="json") for t in trajectory.traces]
        trajectory_meta["builder"] = trajectory.builder
    timing = {f"{p.phase}_ms": p.duration_s * 1000 for p in session.phases}
    return {
        "session_id": session.session_id, "task_id": session.task_id, "status": status,
        "error": session.error,
        "trajectory": {"status": status, "metadata": trajectory_meta, "traces": traces,
                       "error": session.error},
        "timing": timing, "node_id": None,
        "metadata": {"rolloutd": session.model_dump(mode="json", exclude={"phases", "stats"})},
    }


def create_app(client: RolloutClient, *, gateway_url: str | None = None,
               admin_token: str | None = None) -> FastAPI:
    """The facade's app.

    Args:
        client: a connected RolloutClient (with ``store_url`` to return traces).
        gateway_url, admin_token: the gateway whose admin routes the backend calls use.
    """
    app = FastAPI(title="rolloutd REST facade", version="0.1.0",
                  description="POLAR- and ProRL-compatible rollout API over rolloutd.")

    async def status_of(task_id: str) -> PolarTaskStatus:
        handle = client.get_handle(task_id)
        try:
            described = await handle.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise HTTPException(404, detail="Task not found") from None
            raise
        if described.status == WorkflowExecutionStatus.RUNNING:
            try:
                finished = (await handle.query("progress"))["finished"]
            except RPCError:
                finished = 0
            request = await _request_of(handle)
            return PolarTaskStatus(task_id=task_id, status="running",
                                   total_sessions=request.get("num_samples", 1),
                                   completed_sessions=finished)
        if described.status == WorkflowExecutionStatus.COMPLETED:
            group: TaskResult = await handle.result()
            results = [_session_body(client, s) for s in group.sessions]
            return PolarTaskStatus(task_id=task_id, status="completed",
                                   total_sessions=len(results), completed_sessions=len(results),
                                   results=results)
        request = await _request_of(handle)
        return PolarTaskStatus(task_id=task_id, status="failed",
                               total_sessions=request.get("num_samples", 0),
                               completed_sessions=0)

    @app.post("/rollout/task/submit", response_model=SubmitResponse)
    async def submit(request: PolarTaskRequest) -> SubmitResponse:
        """Non-blocking submission; poll ``GET /rollout/task/{task_id}``."""
        try:
            handle = await client.submit(to_task_request(request))
        except InvalidTaskError as e:
            raise HTTPException(422, detail=[{"loc": p.split("."), "msg": m}
                                             for p, m in e.errors]) from None
        except WorkflowAlreadyStartedError:
            raise HTTPException(409, detail=f"task {request.task_id} exists") from None
        return SubmitResponse(task_id=handle.task_id, status="running")

    @app.get("/rollout/task/{task_id}", response_model=PolarTaskStatus)
    async def get_task(task_id: str) -> PolarTaskStatus:
        """The task's status and, once completed, every session's result."""
        return await status_of(task_id)

    @app.delete("/rollout/task/{task_id}", response_model=PolarTaskStatus)
    async def cancel_task(task_id: str) -> PolarTaskStatus:
        """Cancel a task: its sessions stop and tear down."""
        current = await status_of(task_id)
        if current.status == "running":
            await client.cancel(task_id)
        return current

    @app.get("/rollout/status")
    async def rollout_status() -> dict[str, Any]:
        """How many tasks and buffers run."""
        count = client.client.count_workflows
        tasks = await count("WorkflowType='RolloutTaskWorkflow' AND ExecutionStatus='Running'")
        buffers = await count(
            "WorkflowType='RolloutBufferWorkflow' AND ExecutionStatus='Running'")
        return {"status": "ok", "running_tasks": tasks.count, "running_buffers": buffers.count}

    def admin() -> BackendAdmin:
        if not gateway_url:
            raise HTTPException(503, detail="no gateway configured (--gateway-url)")
        return BackendAdmin(gateway_url, admin_token)

    @app.post("/add_llm_server")
    async def add_llm_server(body: AddLLMServer) -> dict[str, Any]:
        """ProRL Agent's backend registration, forwarded to the gateway's pool."""
        async with admin() as a:
            try:
                added = await a.add(body.address, type=body.type, name=body.name)
            except AdminError as e:
                raise HTTPException(e.status_code, detail=str(e)) from None
        return {"status": "ok", "backend": added}

    @app.post("/clear_llm_server")
    async def clear_llm_server() -> dict[str, Any]:
        """ProRL Agent's pool reset, forwarded to the gateway."""
        async with admin() as a:
            try:
                await a.clear()
            except AdminError as e:
                raise HTTPException(e.status_code, detail=str(e)) from None
        return {"status": "ok"}

    return app


async def _request_of(handle: Any) -> dict[str, Any]:
    """The TaskRequest a task workflow was started with (its first history event)."""
    async for event in handle.fetch_history_events():
        attrs = event.workflow_execution_started_event_attributes
        payloads = attrs.input.payloads
        if payloads:
            import json

            return json.loads(payloads[0].data)
        break
    return {}


def serve(address: str, store_url: str | None, host: str, port: int,
          gateway_url: str | None, admin_token: str | None) -> None:
    """Entry point of ``rolloutd rest``: serve the facade with uvicorn until interrupted."""
    import asyncio

    import uvicorn

    async def main() -> None:
        client = await RolloutClient.connect(address, store_url=store_url)
        app = create_app(client, gateway_url=gateway_url, admin_token=admin_token)
        add_stack_status_route(app, client, default_home())
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

    @app.get("/stack/status")
    async def stack_status() -> dict[str, Any]:
        try:  # the name rolloutd.stack.state.STATE_FILE: the stack is this module's sibling
            state = json.loads((home / "stack.json").read_text())
        except FileNotFoundError:
            raise HTTPException(404, f"no stack has run on {home}") from None
        return {"state": state, "sessions_by_phase": await sessions_by_phase(client.client)}
