"""prime-rl / verifiers bridge: an environment server speaking verifiers' own protocol,
backed by rolloutd (``verifiers`` 0.4.0: ``verifiers.v1.serve``).

prime-rl's orchestrator drives environments through ``verifiers.v1.serve.EnvClient``: a ZMQ
DEALER socket, msgpack frames ``[request_id, method, payload]``, methods ``health``, ``run``
and ``cancel``; a run streams its traces as deltas (``serve.delta``) and ends with a
``RunResponse`` (the episode's head and per-trace counts). :class:`RolloutdEnvServer` answers
that protocol on a ROUTER socket, as ``verifiers.v1.serve.EnvServer`` does, with verifiers'
own classes for every message (``HealthResponse``, ``RunRequest``, ``RunResponse``,
``CancelResponse``, ``DeltaStreamer``, ``Trace``, ``Episode``): a ``run`` is one rolloutd
task of one session whose fields come from the request's ``task_data`` (``instruction`` or
``prompt``, ``harness``, ``runtime``, ``evaluator``, ...; ``task_id`` optional), sampled with
the request's ``sampling`` (temperature, top_p, max_tokens); a ``cancel`` (or the client
dropping the run) cancels the rolloutd task, whose session stops and tears its sandbox down.

The episode's trace is the session's: a root user node with the prompt's tokens, then one
node per run of the trace's ``loss_mask`` (assistant nodes hold the sampled tokens, mask
True, with their logprobs; the nodes between hold the tool and environment tokens, mask
False), the reward as ``rewards["rolloutd"]``, the session's ids in ``info``. A session with
a failure cause is an episode with ``ok = False``, the cause in ``errors``, and no reward.

Who owns what: prime-rl owns training and weights; rolloutd owns inference through its
gateway's backend pool (register prime-rl's vLLM servers there with ``BackendAdmin.add(url,
type="vllm")``; the request's ``client`` and ``model`` are recorded in ``info``, not used to
route), sandboxes, sessions and rewards. verifiers' interception (its proxy for agent CLIs,
whose default tunnel is a hosted one) is not used: rolloutd's gateway is that proxy.
Reference: verifiers ``verifiers/v1/serve/{server,client,types,delta}.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import msgpack
import structlog
import zmq
import zmq.asyncio
from verifiers.v1.configs.agent import WireAgentConfig
from verifiers.v1.episode import EnvInfo, Episode
from verifiers.v1.graph import MessageNode
from verifiers.v1.serve.delta import DeltaStreamer, TraceSummary, dump, pack
from verifiers.v1.serve.encoding import msgpack_encoder
from verifiers.v1.serve.types import (
    BaseResponse,
    CancelRequest,
    CancelResponse,
    HealthResponse,
    RunRequest,
    RunResponse,
)
from verifiers.v1.task import WireTaskData
from verifiers.v1.trace import AgentInfo, Error, Reward, Trace, TraceTask
from verifiers.v1.types import AssistantMessage, ToolMessage, UserMessage

from rolloutd.scoring import failure_of, is_scored
from rolloutd.trainer_client.bridges import common
from rolloutd.trainer_client.bridges.common import BridgeStats, group_samples, instruction_of
from rolloutd.trainer_client.client import RolloutClient
from rolloutd.types import SessionResult, Trajectory
from rolloutd.types import Trace as RolloutdTrace

log = structlog.get_logger(__name__)

__all__ = ["TASK_TYPE", "RolloutdEnvServer", "episode_of"]

#: the task type recorded on the traces (``TraceTask.type``)
TASK_TYPE = "RolloutdTask"
#: task fields a request's task_data may set
TASK_FIELDS = ("task_id", *common.TASK_FIELDS)


def _instruction(task_data: Mapping[str, Any]) -> str:
    if isinstance(task_data.get("instruction"), str):
        return task_data["instruction"]
    prompt = task_data.get("prompt")
    if isinstance(prompt, str | list):
        with contextlib.suppress(ValueError):
            return instruction_of(prompt)
    raise ValueError("task_data needs an instruction, or a prompt with a user message")


def _nodes(trace: RolloutdTrace, instruction: str) -> list[MessageNode]:
    """The session's trace as verifiers' message graph: one path, one node per mask run."""
    nodes = [
        MessageNode(
            message=UserMessage(content=instruction),
            token_ids=list(trace.prompt_ids),
            mask=[False] * len(trace.prompt_ids),
        )
    ]
    assistants = [m for m in trace.response_messages if m.get("role") == "assistant"]
    others = [m for m in trace.response_messages if m.get("role") != "assistant"]
    start, num_sampled, num_context = 0, 0, 0
    mask = trace.loss_mask
    while start < len(mask):
        end = start
        while end < len(mask) and mask[end] == mask[start]:
            end += 1
        ids = list(trace.response_ids[start:end])
        if mask[start]:
            found = assistants[num_sampled] if num_sampled < len(assistants) else {}
            message: Any = AssistantMessage(
                content=found.get("content") if isinstance(found.get("content"), str) else None
            )
            nodes.append(
                MessageNode(
                    parent=len(nodes) - 1,
                    message=message,
                    sampled=True,
                    token_ids=ids,
                    mask=[True] * len(ids),
                    logprobs=list(trace.response_logprobs[start:end]),
                )
            )
            num_sampled += 1
        else:
            found = others[num_context] if num_context < len(others) else {}
            content = found.get("content") if isinstance(found.get("content"), str) else ""
            if found.get("role") == "tool" and found.get("tool_call_id"):
                message = ToolMessage(tool_call_id=str(found["tool_call_id"]), content=content)
            else:
                message = UserMessage(content=content)
            nodes.append(
                MessageNode(
                    parent=len(nodes) - 1, message=message, token_ids=ids, mask=[False] * len(ids)
                )
            )
            num_context += 1
        start = end
    return nodes


def episode_of(
    task_data: Mapping[str, Any],
    session: SessionResult | None,
    trajectory: Trajectory | None,
    *,
    env_id: str,
    extra_info: Mapping[str, Any] | None = None,
) -> Episode:
    """A rolloutd session as verifiers' ``Episode`` with at most one trace.

    Args:
        task_data: the request's task data (recorded as the trace's ``task.data``).
        session: the session's result (None: the task ended without one).
        trajectory: its trajectory (None: it has none).
        env_id: ``EnvInfo.id``.
        extra_info: added to each trace's ``info``.

    Returns:
        ``ok`` when the session ran to its end and was scored; the reward in
        ``rewards["rolloutd"]`` then, never for a failed session; the failure cause in
        ``errors`` otherwise.
    """
    task = TraceTask(
        type=TASK_TYPE,
        data=WireTaskData.model_validate(dict(task_data)),
        key=str(task_data.get("task_id") or "") or None,
    )
    episode = Episode(task=task, env=EnvInfo(id=env_id))
    if session is None:
        episode.errors.append(Error(type="no_session", message="the task ended without a session"))
        return episode
    usable = _counted_reward(session)
    failure = failure_of(session)
    if failure is not None:
        episode.errors.append(Error(type=failure.kind, message=failure.message))
    if trajectory is None or not trajectory.traces:
        return episode
    info = {
        "session_id": session.session_id,
        "task_id": session.task_id,
        "status": session.status.value,
        **dict(extra_info or {}),
    }
    for rolloutd_trace in trajectory.traces:
        trace = Trace(
            task=task,
            agent=AgentInfo(config=WireAgentConfig(), name="rolloutd"),
            nodes=_nodes(rolloutd_trace, _instruction(task_data)),
            rewards={"rolloutd": Reward(score=usable)} if usable is not None else {},
            info={**info, "policy_versions": list(rolloutd_trace.policy_versions)},
            is_completed=failure is None,
            ok=usable is not None,
            stop_condition=rolloutd_trace.finish_reason,
        )
        episode.traces.append(trace)
    episode.ok = usable is not None
    return episode


def _counted_reward(session: SessionResult) -> float | None:
    """The session's reward when it counts (:func:`rolloutd.scoring.is_scored`), else None."""
    return float(session.reward) if is_scored(session) else None  # type: ignore[arg-type]


class RolloutdEnvServer:
    """verifiers' env-server protocol over rolloutd sessions.

    Args:
        client: the trainer client (with its blob store).
        address: the ZMQ address to bind (``tcp://127.0.0.1:0`` picks a port).
        env_id: recorded as the episodes' ``env.id``.
        task_prefix: generated task ids are ``{task_prefix}-{request_id}``.
        defaults: task fields every task gets unless its ``task_data`` sets them.

    Attributes:
        address: the bound endpoint (the port resolved).
        stats: :class:`~rolloutd.trainer_client.bridges.common.BridgeStats` of the runs.
        num_cancelled: runs cancelled by a ``cancel`` request or a dropped client.
    """

    def __init__(
        self,
        client: RolloutClient,
        address: str = "tcp://127.0.0.1:0",
        *,
        env_id: str = "rolloutd",
        task_prefix: str = "vf",
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.env_id = env_id
        self.task_prefix = task_prefix
        self.defaults = dict(defaults or {})
        self.stats = BridgeStats()
        self.num_cancelled = 0
        self._running: dict[str, asyncio.Task[Any]] = {}
        self.ctx = zmq.asyncio.Context()
        self.frontend = self.ctx.socket(zmq.ROUTER)
        self.frontend.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.frontend.setsockopt(zmq.LINGER, 0)
        self.frontend.bind(address)
        self.address = self.frontend.getsockopt_string(zmq.LAST_ENDPOINT)

    def _request(self, req: RunRequest, request_id: str) -> dict[str, Any]:
        data = req.task_data
        fields = {k: data[k] for k in TASK_FIELDS if data.get(k) is not None}
        sampling = {
            k: v
            for k, v in (
                ("temperature", req.sampling.temperature),
                ("top_p", req.sampling.top_p),
                ("max_tokens", req.sampling.max_tokens),
            )
            if v is not None
        }
        return {
            **self.defaults,
            "sampling": {**self.defaults.get("sampling", {}), **sampling},
            **fields,
            "instruction": _instruction(data),
            "task_id": fields.get("task_id") or f"{self.task_prefix}-{request_id}",
            "num_samples": 1,
            "model": req.model or None,
        }

    async def _run(self, req: RunRequest, client_id: bytes, request_id: bytes) -> RunResponse:
        request = self._request(req, request_id.decode())
        handle = await self.client.submit(request)
        try:
            group = await handle.result()
        except asyncio.CancelledError:
            self.num_cancelled += 1
            with contextlib.suppress(Exception):
                await handle.cancel()
            log.info("verifiers_run_cancelled", task_id=request["task_id"])
            raise
        samples = group_samples(group, self.client.trajectory, 1)
        self.stats.add(samples, masked=not samples.whole)
        session = group.sessions[0] if group.sessions else None
        trajectory = self.client.trajectory(session) if session and session.trajectory_ref else None
        episode = episode_of(
            {**req.task_data, "task_id": request["task_id"]},
            session,
            trajectory,
            env_id=self.env_id,
            extra_info={"model": req.model, "base_url": req.client.base_url},
        )

        async def send_delta(delta: dict) -> None:
            await self.frontend.send_multipart(
                [client_id, request_id, b"delta", pack(delta)], copy=False
            )

        async with DeltaStreamer(lambda: episode.traces, send_delta) as streamer:
            for trace in episode.traces:
                streamer.watch(trace)
        return RunResponse(
            head=dump(episode, exclude={"traces"}),
            traces=[
                TraceSummary(id=t.id, nodes=len(t.nodes), calls=len(t.calls))
                for t in episode.traces
            ],
        )

    async def _handle(
        self, client_id: bytes, request_id: bytes, method: bytes, payload: bytes
    ) -> None:
        """One request, answered with one ``reply`` frame (as verifiers' ``EnvServer``)."""
        try:
            route = method.decode()
            raw = msgpack.unpackb(payload, raw=False)
            if route == "health":
                response: BaseResponse = HealthResponse()
            elif route == "run":
                try:
                    response = await self._run(
                        RunRequest.model_validate(raw), client_id, request_id
                    )
                finally:
                    self._running.pop(request_id.decode(), None)
            elif route == "cancel":
                target = CancelRequest.model_validate(raw).request_id
                running = self._running.get(target)
                if running is not None:
                    running.cancel()
                response = CancelResponse(cancelled=running is not None)
            else:
                response = BaseResponse(success=False, error=f"unknown method {route!r}")
        except asyncio.CancelledError:
            response = BaseResponse(success=False, error="Cancelled: rollout aborted")
        except Exception as e:  # noqa: BLE001 - a failed request is an answer, not a crash
            log.warning("verifiers_request_failed", error=repr(e))
            response = BaseResponse(success=False, error=f"{type(e).__name__}: {e}")
        data = msgpack.packb(
            response.model_dump(mode="python"), default=msgpack_encoder, use_bin_type=True
        )
        with contextlib.suppress(zmq.ZMQError):
            await self.frontend.send_multipart([client_id, request_id, b"reply", data], copy=False)

    async def serve(self) -> None:
        """Answer requests until cancelled; in-flight runs are cancelled with it."""
        tasks: set[asyncio.Task[None]] = set()
        log.info("verifiers_env_server_up", address=self.address)
        try:
            while True:
                frames = await self.frontend.recv_multipart()
                if len(frames) != 4:
                    continue
                client_id, request_id, method, payload = frames
                task = asyncio.create_task(self._handle(client_id, request_id, method, payload))
                if method == b"run":
                    self._running[request_id.decode()] = task
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        """Close the socket and the context."""
        self.frontend.close()
        self.ctx.term()
