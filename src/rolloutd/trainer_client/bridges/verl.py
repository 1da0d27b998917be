"""verl bridge: an agent loop whose ``run`` is one rolloutd session, with verl's own servers
sampling every model call (``verl`` 0.9.1; scripts/setup_trainers.sh builds its environment).

Who owns what: verl owns training, weights **and inference**. Its agent-loop worker runs
:class:`RolloutdAgentLoop` (registered as ``rolloutd``: ``actor_rollout_ref.rollout.agent.
default_agent_loop=rolloutd``, or ``agent_name: rolloutd`` in a dataset row) and serves
:class:`ServerManagerEndpoint`, a small HTTP endpoint in front of the worker's
``LLMServerClient`` (verl's server manager). The gateway reaches it as a backend of kind
``verl`` (:mod:`rolloutd.proxy.backends.verl`), so the harness in its sandbox talks to the
gateway as its LLM provider and each completion is sampled by verl's vLLM or SGLang
replicas with the weights verl synced to them. rolloutd owns sandboxes, sessions, the
token-faithful trace and the reward.

One ``run`` = one task of one sample (verl repeats each prompt ``rollout.n`` times and runs
the agent loop once per copy; GRPO groups come from verl's ``uid``). The task's fields come
from the row: ``extra_info["rolloutd_task"]`` (harness, runtime, evaluator, ...; the
instruction defaults to the last user message of ``raw_prompt``). The output is verl's
``AgentLoopOutput`` from the session's single trace: ``prompt_ids``, ``response_ids``
(sampled tokens and the tool or environment tokens between them), ``response_mask`` (the
trace's ``loss_mask``: 1 sampled, 0 not), ``response_logprobs`` (0.0 where the mask is 0),
``reward_score`` (verl puts it on the last response token: ``rm_scores[-1]``), ``num_turns``
(model calls merged plus the first user turn) and ``extra_fields`` (session id, policy
versions, finish reason).

A session with a failure cause (after rolloutd's replacements, the task's
``max_replacements``), without exactly one trace, or without a sampled token is left out of
training: its output has an all-zero ``response_mask`` (nothing of it is trained; only
left-out rows have one), ``extra_fields["rolloutd_failure"]`` names why, and ``reward_score``
is 0.0 only because verl computes a reward for a row that has none.
:attr:`RolloutdAgentLoop.stats` counts them per worker process.

Such a row must not move its siblings' GRPO baseline, and verl groups rows by ``uid``, which
the trainer sets per prompt before the rollout and the agent loop cannot change: the legacy
trainer's ``batch.union`` refuses an output whose ``uid`` differs from the prompt's
(``verl/trainer/ppo/ray_trainer.py``, ``fit``), and the v1 trainer stores each output with the
prompt's fields laid over it (``verl/trainer/ppo/v1/agent_loop_tq.py``,
``_agent_loop_postprocess``). So this module registers an advantage estimator in verl's own
registry, ``rolloutd_grpo`` (:func:`compute_rolloutd_grpo_advantage`): verl's GRPO over the
rows with a trainable token, 0 for the others. The trainer must be configured with it:
``algorithm.adv_estimator=rolloutd_grpo`` and the module imported in the trainer's process
(``VERL_USE_EXTERNAL_MODULES=rolloutd.trainer_client.bridges.verl``).

:func:`to_data_proto` builds verl's ``DataProto`` from
:func:`~rolloutd.trainer_client.training.exports.to_verl_batch`. Reference: verl
``verl/experimental/agent_loop/agent_loop.py`` (``AgentLoopBase``, ``AgentLoopOutput``,
``register``, ``AgentLoopWorker._run_agent_loop``), ``verl/workers/rollout/
llm_server.py`` (``LLMServerClient.generate`` -> ``TokenOutput``) and ``verl/trainer/ppo/
core_algos.py`` (``register_adv_est``, ``compute_grpo_outcome_advantage``).
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, ClassVar

import numpy as np
import structlog
import torch
import uvicorn
from fastapi import FastAPI
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, register_adv_est

from rolloutd.routes import load_routes
from rolloutd.settings import CommonSettings
from rolloutd.trainer_client.bridges.common import (
    BridgeStats,
    SessionSample,
    group_samples,
    instruction_of,
)
from rolloutd.trainer_client.client import RolloutClient
from rolloutd.trainer_client.training.exports import to_verl_batch
from rolloutd.types import Trajectory

log = structlog.get_logger(__name__)

__all__ = [
    "ADV_ESTIMATOR",
    "AGENT_NAME",
    "TASK_FIELD",
    "RolloutdAgentLoop",
    "ServerManagerEndpoint",
    "compute_rolloutd_grpo_advantage",
    "left_out_output",
    "to_data_proto",
]

#: the name the agent loop is registered under
AGENT_NAME = "rolloutd"
#: the ``extra_info`` key holding a row's rolloutd task fields
TASK_FIELD = "rolloutd_task"
#: the advantage estimator the trainer must use: ``algorithm.adv_estimator=rolloutd_grpo``
ADV_ESTIMATOR = "rolloutd_grpo"


@register_adv_est(ADV_ESTIMATOR)
def compute_rolloutd_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's GRPO advantage with left-out rows outside every group's statistics.

    A row whose ``response_mask`` is all 0 (a session the bridge left out:
    :func:`left_out_output`) gets advantage 0 and is not in its group's mean or std; the
    other rows go to verl's own ``compute_grpo_outcome_advantage`` unchanged, so their
    advantages are the ones verl gives the group without the left-out rows. verl calls it
    through its estimator registry (``compute_advantage``: ``token_level_rewards``,
    ``response_mask``, ``index`` = the ``uid`` column, ``config`` = ``algorithm``).

    Args:
        token_level_rewards: float [B, R], the outcome reward on one token of each row.
        response_mask: int or bool [B, R], 1 on trainable tokens.
        index: np.ndarray [B], the GRPO group of each row (verl's ``uid``).
        epsilon: added to the group's std (verl's default).
        norm_adv_by_std_in_grpo: divide by the group's std (GRPO) or not (Dr. GRPO); None
            takes ``config.norm_adv_by_std_in_grpo`` (default True), as verl's estimators do.
        config: verl's ``algorithm`` config (or None).
        **kwargs: what else verl passes (``reward_baselines``), unused.

    Returns:
        ``(advantages, returns)``, both float [B, R], equal (verl's GRPO convention), 0
        wherever ``response_mask`` is 0.
    """
    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = (
            True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
        )
    advantages = torch.zeros_like(token_level_rewards)
    kept = (response_mask != 0).any(dim=-1)
    if kept.any():
        rows = kept.nonzero().squeeze(-1)
        kept_advantages, _ = compute_grpo_outcome_advantage(
            token_level_rewards=token_level_rewards[rows],
            response_mask=response_mask[rows],
            index=np.asarray(index, dtype=object)[rows.numpy()],
            epsilon=epsilon,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
            config=config,
        )
        advantages[rows] = kept_advantages.to(advantages.dtype)
    return advantages, advantages


def agent_loop_output(sample: SessionSample, metrics: AgentLoopMetrics) -> AgentLoopOutput:
    """verl's ``AgentLoopOutput`` of one usable session: its trace, reward and, when the
    session's backend returned them, its routed experts in ``routed_experts`` (a ``(rows,
    num_layers, top_k)`` array over prompt and response, verl's R3 field: ``as_dict`` pads it
    to the whole sequence); rolloutd's per-token facts in ``extra_fields``."""
    return AgentLoopOutput(
        prompt_ids=sample.prompt_ids,
        response_ids=sample.response_ids,
        response_mask=sample.loss_mask,
        response_logprobs=sample.response_logprobs,
        routed_experts=sample.routed_experts,
        reward_score=sample.reward,
        num_turns=sample.num_turns + 1,
        metrics=metrics,
        extra_fields={
            "rolloutd_session_id": sample.session_id,
            "rolloutd_task_id": sample.task_id,
            "rolloutd_policy_versions": sample.policy_versions,
            "rolloutd_token_policy_versions": sample.token_policy_versions,
            "rolloutd_logprob_modes": sample.logprob_modes,
            "rolloutd_finish_reason": sample.finish_reason,
        },
    )


def left_out_output(
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    *,
    reason: str,
    metrics: AgentLoopMetrics,
    session_id: str | None = None,
    task_id: str | None = None,
) -> AgentLoopOutput:
    """The ``AgentLoopOutput`` of a session left out of training.

    Nothing of it is trained (``response_mask`` all 0, the one kind of row that has that, so
    :func:`compute_rolloutd_grpo_advantage` leaves it out of its group's statistics);
    ``reward_score`` is 0.0 because verl computes a reward for a row that has none.

    Args:
        prompt_ids: list[int], length P >= 1.
        response_ids: list[int], length R >= 1.
        reason: why it is left out (a failure kind, ``num_traces=k``, ``no_sampled_token``,
            ...): ``extra_fields["rolloutd_failure"]``.
        metrics: verl's per-run metrics.
        session_id / task_id: where it comes from (None when the task has no session).
    """
    return AgentLoopOutput(
        prompt_ids=list(prompt_ids),
        response_ids=list(response_ids),
        response_mask=[0] * len(response_ids),
        response_logprobs=[0.0] * len(response_ids),
        reward_score=0.0,
        num_turns=0,
        metrics=metrics,
        extra_fields={
            "rolloutd_failure": reason,
            "rolloutd_session_id": session_id,
            "rolloutd_task_id": task_id,
        },
    )


@register(AGENT_NAME)
class RolloutdAgentLoop(AgentLoopBase):
    """verl agent loop: one rolloutd session per ``run``.

    The rolloutd client is per process: :meth:`configure` sets it, else the first ``run``
    connects with the process's settings (:class:`rolloutd.settings.CommonSettings`:
    ``ROLLOUTD_TEMPORAL_ADDRESS``, ``ROLLOUTD_TEMPORAL_NAMESPACE``, ``ROLLOUTD_STORE_URL``), as
    every rolloutd process does (a verl worker is a Ray actor, built by
    ``hydra.utils.instantiate`` with verl's arguments only).

    Attributes:
        client: the process's rolloutd client.
        stats: the process's :class:`~rolloutd.trainer_client.bridges.common.BridgeStats`.
        task_prefix: task ids are ``{task_prefix}-{uuid}``.
    """

    client: ClassVar[RolloutClient | None] = None
    stats: ClassVar[BridgeStats] = BridgeStats()
    task_prefix: ClassVar[str] = "verl"

    @classmethod
    def configure(cls, client: RolloutClient, *, task_prefix: str = "verl") -> None:
        """Set the process's rolloutd client (tests, or a worker set up by hand)."""
        cls.client = client
        cls.task_prefix = task_prefix
        cls.stats = BridgeStats()

    @classmethod
    async def _client(cls) -> RolloutClient:
        if cls.client is None:
            settings = CommonSettings()
            cls.client = await RolloutClient.connect(
                settings.temporal_address,
                namespace=settings.temporal_namespace,
                store_url=settings.store_url,
            )
        return cls.client

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Run the row as one rolloutd session and return verl's output.

        Args:
            sampling_params: verl's (``temperature``, ``top_p``, ...): become the task's
                ``sampling`` unless the row sets its own.
            **kwargs: the dataset row: ``raw_prompt`` and ``extra_info["rolloutd_task"]``.

        Returns:
            ``AgentLoopOutput`` (see the module docstring).

        Raises:
            ValueError: the row names no task.
        """
        started = time.monotonic()
        extra = kwargs.get("extra_info") or {}
        fields = extra.get(TASK_FIELD) if isinstance(extra, Mapping) else None
        if not isinstance(fields, Mapping):
            raise ValueError(f"the row's extra_info has no {TASK_FIELD!r} mapping")
        sampling = {
            k: sampling_params[k] for k in ("temperature", "top_p", "top_k") if k in sampling_params
        }
        if "max_tokens" in sampling_params:
            sampling["max_tokens"] = sampling_params["max_tokens"]
        client = await self._client()
        request = {
            "instruction": instruction_of(kwargs.get("raw_prompt", ""), "raw_prompt"),
            "sampling": sampling,
            **fields,
            "task_id": f"{self.task_prefix}-{uuid.uuid4().hex[:12]}",
            "num_samples": 1,
        }
        group = await (await client.submit(request)).result()
        routes = partial(load_routes, client.store) if client.store is not None else None
        samples = group_samples(group, client.trajectory, 1, routes)
        for sample in list(samples.samples):
            # an all-zero response_mask marks a left-out row for the advantage estimator, so a
            # scored session without a sampled token cannot be told from one and is left out
            if not any(sample.loss_mask):
                samples.samples.remove(sample)
                samples.left_out[sample.session_id] = "no_sampled_token"
        self.stats.add(samples, masked=not samples.whole)
        metrics = AgentLoopMetrics(generate_sequences=time.monotonic() - started)
        if not samples.whole:
            reason = next(iter(samples.left_out.values()), "no_session")
            session_id = next(iter(samples.left_out), None)
            log.warning("verl_session_left_out", task_id=group.task_id, reason=reason)
            prompt_ids, response_ids = self._placeholder(group, client)
            return left_out_output(
                prompt_ids,
                response_ids,
                reason=reason,
                metrics=metrics,
                session_id=session_id,
                task_id=group.task_id,
            )
        (sample,) = samples.samples
        return agent_loop_output(sample, metrics)

    def _placeholder(self, group: Any, client: RolloutClient) -> tuple[list[int], list[int]]:
        """A left-out session's tokens: its own trace when it has one, else one
        end-of-sequence token after the end-of-sequence prompt."""
        for session in group.sessions:
            if session.trajectory_ref:
                trajectory: Trajectory = client.trajectory(session)
                for trace in trajectory.traces:
                    if trace.prompt_ids and trace.response_ids:
                        return list(trace.prompt_ids), list(trace.response_ids)
        eos = int(self.tokenizer.eos_token_id or 0)
        return [eos], [eos]


class ServerManagerEndpoint:
    """HTTP in front of verl's server manager, for the gateway's ``verl`` backend.

    ``POST /generate`` calls ``server_manager.generate(request_id, prompt_ids=...,
    sampling_params=...)`` (verl's ``LLMServerClient``) and answers the ``TokenOutput``'s ids
    and logprobs with the text decoded by the worker's tokenizer (wire:
    :mod:`rolloutd.proxy.backends.verl`). It runs in the worker's event loop, where the
    server manager's calls belong.

    Args:
        server_manager: verl's ``LLMServerClient`` (or a subclass).
        tokenizer: the worker's tokenizer.
        context_size: the servers' context window in tokens (verl's
            ``rollout.max_model_len``, or prompt plus response length).
        host: the address to listen on (the gateway must reach it).
        port: 0 picks a free one.

    Attributes:
        url: ``http://{host}:{port}`` once started.
    """

    def __init__(
        self,
        server_manager: Any,
        tokenizer: Any,
        *,
        context_size: int,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.context_size = context_size
        self.host = host
        self.port = port or _free_port(host)
        self.url = f"http://{host}:{self.port}"
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids = {int(eos)} if eos is not None else set()

    def app(self) -> Any:
        """The FastAPI application (two routes)."""
        app = FastAPI()

        @app.get("/context_size")
        async def context_size() -> dict[str, int]:
            return {"context_size": self.context_size}

        @app.post("/generate")
        async def generate(body: dict[str, Any]) -> dict[str, Any]:
            params = dict(body.get("sampling_params") or {})
            if params.get("seed") is None:
                params.pop("seed", None)
            prompt_ids = [int(t) for t in body["prompt_ids"]]
            output = await self.server_manager.generate(
                body.get("request_id") or "rolloutd",
                prompt_ids=prompt_ids,
                sampling_params=params,
            )
            ids = list(output.token_ids)
            logprobs = list(output.log_probs or [])
            ended_by_eos = bool(ids) and ids[-1] in self.eos_ids
            max_tokens = params.get("max_tokens")
            finish = (
                "length"
                if (max_tokens and len(ids) >= max_tokens and not ended_by_eos)
                else ("stop")
            )
            text_ids = ids[:-1] if ended_by_eos else ids
            return {
                "token_ids": ids,
                "log_probs": logprobs,
                "text": self.tokenizer.decode(text_ids, skip_special_tokens=False),
                "ended_by_eos": ended_by_eos,
                "finish_reason": finish,
                "stop_reason": output.stop_reason,
            }

        return app

    async def start(self) -> str:
        """Serve in this event loop; returns :attr:`url` once it accepts connections."""
        config = uvicorn.Config(self.app(), host=self.host, port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        deadline = time.monotonic() + 30
        while not self._server.started:
            if self._task.done() or time.monotonic() > deadline:
                raise RuntimeError(f"the server manager endpoint did not start on {self.url}")
            await asyncio.sleep(0.05)
        return self.url

    async def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await self._task


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def to_data_proto(
    trajectories: Sequence[Trajectory], *, pad_token_id: int, **kwargs: Any
) -> DataProto:
    """verl's ``DataProto`` of a batch of trajectories (one row per trace).

    Tensors from :func:`~rolloutd.trainer_client.training.exports.to_verl_batch` (left-padded
    prompts, right-padded responses, ``response_mask``, ``rollout_log_probs``,
    ``token_level_scores`` with the reward on the last response token); ``uid`` (the task:
    the GRPO group), ``session_id``, ``failure`` and ``logprob_modes`` as non-tensor fields
    (every field the export gives as a numpy object array).

    Args:
        trajectories: the sessions.
        pad_token_id: the tokenizer's pad id.
        **kwargs: passed to ``to_verl_batch`` (limits, ``reward_position``, ...).

    Raises:
        ValueError: from ``to_verl_batch`` (no trace, a trace over a limit, no reward).
    """
    batch = to_verl_batch(trajectories, pad_token_id=pad_token_id, **kwargs)
    non_tensors = {k: batch.pop(k) for k in [k for k, v in batch.items() if v.dtype == object]}
    return DataProto.from_dict(tensors=batch, non_tensors=non_tensors)
