"""TRL bridge: rolloutd sessions as the rollouts of TRL's GRPO trainers (``pip install
'rolloutd[trl]'``, tested against ``trl`` 1.16.0).

Two ways in:

- **Synchronous** ``GRPOTrainer(rollout_func=RolloutFunc(...))``. TRL hands the function the
  prompts of one generation batch, each already repeated ``num_generations`` (G) times in a
  row (TRL's ``RepeatSampler``); the function makes each run of G equal prompts one rolloutd
  task with ``num_samples = G`` (its fields from the dataset row that names the prompt:
  instruction, harness, runtime, evaluator, ...), waits for the groups and returns, per
  sample and in the prompts' order, ``prompt_ids``, ``completion_ids``, ``logprobs`` and
  ``env_mask`` (the trace's ``loss_mask``: 1 on sampled tokens, 0 on tool and environment
  tokens, which TRL multiplies into its completion mask), plus ``rolloutd_reward``, which
  :func:`rolloutd_reward` hands to TRL as the reward. TRL computes group advantages over
  ``view(-1, G)``, so it must get whole groups: rolloutd replaces sessions that failed for
  infrastructure (the task's ``max_replacements``); a group still not whole is **masked
  whole**: every row's ``env_mask`` is 0 and its reward None (TRL gives such a row advantage
  0 and no loss), never a made-up reward; a sample without any tokens (a failed session) is
  one end-of-sequence token, masked. :attr:`RolloutFunc.stats` counts groups masked and
  sessions left out.
  :class:`~rolloutd.trainer_client.bridges.trl_sync.EngineSyncCallback` writes the trainer's
  weights to the engine after every optimizer step, so the next rollouts sample the new
  policy; it lives in a module of its own because it imports transformers, gguf and torch,
  which this one does not: a process with rolloutd's client install imports this module.
- **Asynchronous** ``trl.experimental.async_grpo.AsyncGRPOTrainer``: its two protocols in
  :mod:`rolloutd.trainer_client.bridges.trl_async` (``RolloutWorker`` over rolloutd's durable
  buffer, ``WeightTransfer`` through rolloutd's weight sync).

Who owns what: TRL owns the loss, optimizer and weights; rolloutd owns inference (its
gateway and backends), sandboxes, sessions and rewards; weights reach rolloutd's engine after
each step. Reference: TRL ``trl/trainer/grpo_trainer.py`` (``_generate``: the ``rollout_func``
contract, ``env_mask``, unscorable rows), ``trl/experimental/async_grpo/
async_grpo_trainer.py`` (the two protocols) and ``async_rollout_worker.py`` (``RolloutSample``,
advantages ``(r - mean) / (std + 1e-8)`` over the scored rewards of a group).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from rolloutd.trainer_client.bridges.common import (
    TASK_FIELDS,
    BridgeStats,
    GroupSamples,
    group_samples,
    instruction_of,
)
from rolloutd.trainer_client.client import RolloutClient
from rolloutd.trainer_client.tracking import rollout_stats, session_url
from rolloutd.types import TaskResult

log = structlog.get_logger(__name__)

__all__ = [
    "METRICS_FIELD",
    "REWARD_FIELD",
    "VIEWER_FIELD",
    "RolloutFunc",
    "prompt_key",
    "rolloutd_reward",
]

#: the extra field of the rollout function's output that carries each sample's reward
REWARD_FIELD = "rolloutd_reward"
#: the extra field that carries the batch's rollout statistics (one dict for the batch:
#: TRL gives a field that is not a list to every sample), logged by :func:`rolloutd_reward`
METRICS_FIELD = "rolloutd_metrics"
#: the extra field that carries each sample's trace viewer link (None: no viewer)
VIEWER_FIELD = "rolloutd_viewer"
#: task fields that a row may give as a JSON string (Arrow columns of mixed dicts)
JSON_FIELDS = ("harness", "runtime", "evaluator", "builder", "sampling", "phases", "metadata")


def prompt_key(prompt: Any) -> str:
    """The key a prompt is looked up by: the text itself, or a conversation as sorted JSON."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def rolloutd_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """TRL reward function: the rolloutd reward of each sample, None for a masked one; it
    also hands the batch's rollout statistics to TRL's own logging.

    TRL passes the rollout function's extra fields to reward functions as keyword arguments
    (``GRPOTrainer._generate_and_score_completions``); a None reward makes the row
    unscorable (NaN reward, advantage 0). TRL also passes ``log_metric`` (a scalar averaged
    over each logging step and logged beside ``kl`` and ``reward``, so ``report_to``'s
    TensorBoard or W&B shows it) and ``log_extra`` (a column of the completions table): the
    statistics of :class:`RolloutFunc`'s batch (``rolloutd/...``,
    :mod:`rolloutd.trainer_client.tracking`) go through the first, each sample's trace
    viewer link through the second.

    Args:
        completions: the decoded completions, length B (only their number is used).
        **kwargs: must hold ``rolloutd_reward``: list[float | None], length B; may hold
            ``rolloutd_metrics`` (the batch's, once per sample), ``rolloutd_viewer``,
            ``log_metric`` and ``log_extra``.

    Raises:
        KeyError: the trainer's rollout function is not :class:`RolloutFunc`.
    """
    rewards = kwargs[REWARD_FIELD]
    if len(rewards) != len(completions):
        raise ValueError(f"{len(rewards)} rewards for {len(completions)} completions")
    log_metric, metrics = kwargs.get("log_metric"), kwargs.get(METRICS_FIELD)
    if log_metric is not None and metrics:
        for name, value in metrics[0].items():
            log_metric(name, value)
    log_extra, links = kwargs.get("log_extra"), kwargs.get(VIEWER_FIELD)
    if log_extra is not None and links and any(links):
        log_extra(VIEWER_FIELD, ["" if link is None else link for link in links])
    return [None if r is None else float(r) for r in rewards]


class RolloutFunc:
    """``GRPOTrainer``'s ``rollout_func`` backed by rolloutd tasks.

    Args:
        client: the trainer client (its blob store is read for the trajectories).
        run: runs the client's coroutines from TRL's thread (:class:`LoopRunner`).
        rows: the dataset's rows: each has ``prompt`` (the value TRL passes) and task fields
            (``harness`` required; ``instruction`` defaults to the prompt's text; ``runtime``,
            ``evaluator``, ``sampling``, ... as :class:`~rolloutd.types.TaskRequest`); a
            field may be a JSON string (Arrow columns of mixed dicts).
        task_prefix: task ids are ``{task_prefix}-{call}-{index}``.
        defaults: task fields every task gets unless its row sets them.
        viewer_url: the trace viewer's base URL (the REST facade's): each sample's link goes
            to TRL's completions table (``log_completions``); None: no link.

    Attributes:
        stats: cumulative counts (:class:`BridgeStats`).
        last: the last call's figures: ``rollout_s``, ``groups``, ``masked``, ``rewards``,
            ``stats`` (:class:`~rolloutd.trainer_client.tracking.RolloutStats`).

    Each call's batch statistics (:func:`~rolloutd.trainer_client.tracking.rollout_stats`:
    reward, pass rate, failures by kind (a judge's apart), groups masked, replacements, turns and
    tokens per session, rollout wall time, staleness against the trainer's step, which is the
    engine's policy version under
    :class:`~rolloutd.trainer_client.bridges.trl_sync.EngineSyncCallback`) and the cumulative
    :class:`BridgeStats` (``rolloutd/bridge/...``) reach TRL's logging through
    :func:`rolloutd_reward`.

    Raises:
        ValueError: two rows share a prompt but name different tasks.
    """

    def __init__(
        self,
        client: RolloutClient,
        run: Callable[[Any], Any],
        rows: Iterable[Mapping[str, Any]],
        *,
        task_prefix: str,
        defaults: Mapping[str, Any] | None = None,
        viewer_url: str | None = None,
    ) -> None:
        self.client = client
        self.viewer_url = viewer_url
        self.run = run
        self.task_prefix = task_prefix
        self.defaults = dict(defaults or {})
        self.tasks: dict[str, dict[str, Any]] = {}
        for row in rows:
            key = prompt_key(row["prompt"])
            spec = {"instruction": instruction_of(row["prompt"], "a conversational prompt")}
            for name in TASK_FIELDS:
                value = row.get(name)
                if value is None:
                    continue
                if isinstance(value, str) and name in JSON_FIELDS:
                    value = json.loads(value)
                spec[name] = value
            if key in self.tasks and self.tasks[key] != spec:
                raise ValueError(f"two rows share the prompt {key[:80]!r} with different tasks")
            self.tasks[key] = spec
        self.stats = BridgeStats()
        self.last: dict[str, Any] = {}
        self._calls = 0

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Run one generation batch as rolloutd tasks (TRL's ``rollout_func(prompts, trainer)``).

        Args:
            prompts: B prompts, each repeated G times in a row (B divisible by G).
            trainer: the ``GRPOTrainer`` (its ``num_generations`` or
                ``num_generations_eval``, its tokenizer's end-of-sequence id).

        Returns:
            Lists of length B, in the prompts' order: ``prompt_ids`` (list[int]),
            ``completion_ids`` (list[int], length R_i), ``logprobs`` (list[float], R_i),
            ``env_mask`` (list[int], R_i), ``rolloutd_reward`` (float | None),
            ``rolloutd_session_id`` (str | None), ``rolloutd_viewer`` (str | None); and
            ``rolloutd_metrics``, the batch's statistics (one dict).

        Raises:
            ValueError: B is not a multiple of G, a run of G prompts is not one prompt, or a
                prompt is not in the rows.
        """
        started = time.monotonic()
        num_generations = (
            trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        )
        if len(prompts) % num_generations:
            raise ValueError(f"{len(prompts)} prompts are not groups of {num_generations}")
        self._calls += 1
        requests = []
        for index in range(0, len(prompts), num_generations):
            block = prompts[index : index + num_generations]
            keys = {prompt_key(p) for p in block}
            if len(keys) != 1:
                raise ValueError(
                    f"prompts {index}..{index + num_generations - 1} are not one prompt "
                    f"repeated {num_generations} times"
                )
            (key,) = keys
            if key not in self.tasks:
                raise ValueError(f"prompt {key[:80]!r} is not in the rows")
            requests.append(
                {
                    **self.defaults,
                    **self.tasks[key],
                    "task_id": f"{self.task_prefix}-{self._calls}-{index // num_generations}",
                    "num_samples": num_generations,
                }
            )
        groups: list[TaskResult] = self.run(self._run_tasks(requests))
        eos = _eos_id(trainer)
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            REWARD_FIELD: [],
            "rolloutd_session_id": [],
        }
        num_masked = 0
        for group in groups:
            samples = group_samples(group, self.client.trajectory, num_generations)
            masked = not samples.whole
            num_masked += int(masked)
            self.stats.add(samples, masked=masked)
            if masked:
                log.warning(
                    "trl_group_masked",
                    task_id=group.task_id,
                    num_usable=len(samples.samples),
                    num_samples=num_generations,
                    left_out=samples.left_out,
                )
            _append_group(out, samples, num_generations, eos, masked)
        rollout_s = time.monotonic() - started
        stats = rollout_stats(
            groups,
            policy_version=int(trainer.state.global_step),
            groups_left_out={"masked": num_masked},
            rollout_wall_s=rollout_s,
        )
        out[VIEWER_FIELD] = [
            session_url(self.viewer_url, sid) if self.viewer_url and sid else None
            for sid in out["rolloutd_session_id"]
        ]
        out[METRICS_FIELD] = {  # type: ignore[assignment] - one dict for the batch
            **stats.metrics(),
            **self.stats.metrics(),
        }
        self.last = {
            "rollout_s": rollout_s,
            "groups": len(groups),
            "masked": num_masked,
            "rewards": [r for r in out[REWARD_FIELD] if r is not None],
            "stats": stats,
        }
        return out

    async def _run_tasks(self, requests: list[dict[str, Any]]) -> list[TaskResult]:
        handles = [await self.client.submit(r) for r in requests]
        return list(await asyncio.gather(*(h.result() for h in handles)))


def _eos_id(trainer: Any) -> int:
    ids = getattr(trainer, "eos_token_ids", None) or []
    if ids:
        return int(ids[0])
    tokenizer = trainer.processing_class
    return int(tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0)


def _append_group(
    out: dict[str, list[Any]], group: GroupSamples, num_generations: int, eos: int, masked: bool
) -> None:
    """Append G rows for one group: its samples in sample order, then one masked
    end-of-sequence row per missing sample (only when the group is masked)."""
    for sample in group.samples:
        out["prompt_ids"].append(sample.prompt_ids)
        out["completion_ids"].append(sample.response_ids)
        out["logprobs"].append(sample.response_logprobs)
        out["env_mask"].append([0] * len(sample.loss_mask) if masked else sample.loss_mask)
        out[REWARD_FIELD].append(None if masked else sample.reward)
        out["rolloutd_session_id"].append(sample.session_id)
    for _ in range(num_generations - len(group.samples)):
        out["prompt_ids"].append([eos])
        out["completion_ids"].append([eos])
        out["logprobs"].append([0.0])
        out["env_mask"].append([0])
        out[REWARD_FIELD].append(None)
        out["rolloutd_session_id"].append(None)
