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
  :class:`EngineSyncCallback` writes the trainer's weights to the engine after every
  optimizer step (GGUF export, :class:`~rolloutd.trainer_client.weight_sync.WeightSync`,
  :func:`~rolloutd.trainer_client.probe.probe`), so the next rollouts sample the new policy.
- **Asynchronous** ``trl.experimental.async_grpo.AsyncGRPOTrainer``: :class:`RolloutWorker`
  implements its ``RolloutWorkerProtocol`` over rolloutd's durable buffer (start, stop,
  ``update_model_version``, ``check_health``, ``RolloutSample`` rows with the policy version
  and group id) and :class:`WeightTransfer` its ``WeightTransferProtocol`` through rolloutd's
  weight sync (pause, GGUF to the engine, resume with a new ``policy_version``).

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
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from transformers import TrainerCallback
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

from rolloutd.trainer_client.bridges.common import (
    BridgeStats,
    GroupSamples,
    group_samples,
)
from rolloutd.trainer_client.client import RolloutClient
from rolloutd.trainer_client.gguf_export import export_gguf
from rolloutd.trainer_client.probe import ProbeResult, probe
from rolloutd.trainer_client.weight_sync import WeightSync
from rolloutd.types import TaskResult

log = structlog.get_logger(__name__)

__all__ = [
    "REWARD_FIELD",
    "EngineSyncCallback",
    "RolloutFunc",
    "RolloutWorker",
    "WeightTransfer",
    "prompt_key",
    "rolloutd_reward",
]

#: the extra field of the rollout function's output that carries each sample's reward
REWARD_FIELD = "rolloutd_reward"
#: task fields a dataset row may set (the rest of the row is ignored)
TASK_FIELDS = (
    "instruction",
    "harness",
    "runtime",
    "evaluator",
    "builder",
    "sampling",
    "phases",
    "timeout_s",
    "max_replacements",
    "max_session_attempts",
    "model",
    "tenant",
    "priority",
    "metadata",
    "timeout_reward",
)
#: task fields that a row may give as a JSON string (Arrow columns of mixed dicts)
JSON_FIELDS = ("harness", "runtime", "evaluator", "builder", "sampling", "phases", "metadata")


def prompt_key(prompt: Any) -> str:
    """The key a prompt is looked up by: the text itself, or a conversation as sorted JSON."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def _instruction_of(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users or not isinstance(users[-1].get("content"), str):
        raise ValueError("a conversational prompt needs a last user message with text content")
    return users[-1]["content"]


def rolloutd_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """TRL reward function: the rolloutd reward of each sample, None for a masked one.

    TRL passes the rollout function's extra fields to reward functions as keyword arguments
    (``GRPOTrainer._generate_and_score_completions``); a None reward makes the row
    unscorable (NaN reward, advantage 0).

    Args:
        completions: the decoded completions, length B (only their number is used).
        **kwargs: must hold ``rolloutd_reward``: list[float | None], length B.

    Raises:
        KeyError: the trainer's rollout function is not :class:`RolloutFunc`.
    """
    rewards = kwargs[REWARD_FIELD]
    if len(rewards) != len(completions):
        raise ValueError(f"{len(rewards)} rewards for {len(completions)} completions")
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

    Attributes:
        stats: cumulative counts (:class:`BridgeStats`).
        last: the last call's figures: ``rollout_s``, ``groups``, ``masked``, ``rewards``.

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
    ) -> None:
        self.client = client
        self.run = run
        self.task_prefix = task_prefix
        self.defaults = dict(defaults or {})
        self.tasks: dict[str, dict[str, Any]] = {}
        for row in rows:
            key = prompt_key(row["prompt"])
            spec = {"instruction": _instruction_of(row["prompt"])}
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
            ``rolloutd_session_id`` (str | None).

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
        self.last = {
            "rollout_s": time.monotonic() - started,
            "groups": len(groups),
            "masked": num_masked,
            "rewards": [r for r in out[REWARD_FIELD] if r is not None],
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


class EngineSyncCallback(TrainerCallback):
    """After every optimizer step: the trainer's weights to the engine, then a probe.

    ``on_step_end``: export the model's fp32 weights as a GGUF (the catalog model's GGUF as
    template, :func:`~rolloutd.trainer_client.gguf_export.export_gguf`), run
    :meth:`WeightSync.update` (pause, engine reload, ``policy_version = global_step``,
    resume) and compare the engine's logprobs with the trainer's on a probe prompt
    (:func:`~rolloutd.trainer_client.probe.probe`). Rollouts of the next step then sample the
    new weights. transformers' ``TrainerCallback`` API.

    Args:
        sync: the weight sync (admin client and the engine's loader).
        run: runs ``sync``'s coroutines from the trainer's thread.
        template: the catalog model's GGUF (metadata, tokenizer).
        out_dir: where the GGUFs go (the previous one is deleted after each sync).
        engine_url: llama-server's URL for the probe (None: no probe).
        probe_ids: the probe prompt, list[int].
        on_sync: called with ``(step, sync_s, probe_result)`` after each sync.

    Attributes:
        rows: one dict per step: ``step``, ``export_s``, ``sync_s``, ``probe_mismatch``,
            ``probe_max``.
    """

    def __init__(
        self,
        sync: WeightSync,
        run: Callable[[Any], Any],
        template: str | Path,
        out_dir: str | Path,
        *,
        engine_url: str | None = None,
        probe_ids: Sequence[int] = (),
        on_sync: Callable[[int, float, ProbeResult | None], None] | None = None,
    ) -> None:
        self.sync = sync
        self.run = run
        self.template = Path(template)
        self.out_dir = Path(out_dir)
        self.engine_url = engine_url
        self.probe_ids = list(probe_ids)
        self.on_sync = on_sync
        self.rows: list[dict[str, Any]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Sync the weights of ``kwargs["model"]`` as policy version ``state.global_step``."""
        model = kwargs["model"]
        step = int(state.global_step)
        t0 = time.monotonic()
        path = export_gguf(model.state_dict(), self.template, self.out_dir / f"policy-{step}.gguf")
        export_s = time.monotonic() - t0
        sync_s = self.run(self.sync.update(path, policy_version=step))
        for old in self.out_dir.glob("policy-*.gguf"):
            if old != path:
                old.unlink(missing_ok=True)
        result = None
        if self.engine_url and self.probe_ids:
            was_training = model.training
            model.eval()
            result = probe(model, self.engine_url, self.probe_ids)
            model.train(was_training)
        self.rows.append(
            {
                "step": step,
                "export_s": export_s,
                "sync_s": sync_s,
                "probe_mismatch": None if result is None else result.mean_abs_diff,
                "probe_max": None if result is None else result.max_abs_diff,
            }
        )
        if self.on_sync is not None:
            self.on_sync(step, sync_s, result)


# --------------------------------------------------------------------------- async GRPO


def rollout_samples(
    group: GroupSamples,
    *,
    policy_version: int,
    group_id: int,
    enqueued_at: float | None = None,
) -> list[RolloutSample]:
    """One buffered group as TRL's ``RolloutSample`` rows (one per usable session).

    Layout (TRL ``async_rollout_worker.py``, ``TrainingSequence``): ``input_ids`` is prompt
    then response (int64, length P + R); ``completion_mask`` is 0 on the prompt and the
    trace's ``loss_mask`` on the response (int64); ``old_log_probs`` is 0 on the prompt and
    the sampled logprobs on the response (float32); ``advantage`` is TRL's
    ``(r - mean) / (std + 1e-8)`` over the group's rewards (population std).

    Args:
        group: a whole group (:func:`~rolloutd.trainer_client.bridges.common.group_samples`).
        policy_version: the version its sessions were sampled under (``model_version``).
        group_id: TRL's group id.
        enqueued_at: wall-clock time the rows were queued, s since the epoch.

    Raises:
        ValueError: the group is not whole.
    """
    if not group.whole:
        raise ValueError(f"group {group.task_id} is not whole")
    rewards = np.array([s.reward for s in group.samples], dtype=float)
    advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
    rows = []
    for sample, advantage in zip(group.samples, advantages, strict=True):
        num_prompt = len(sample.prompt_ids)
        rows.append(
            RolloutSample(
                prompt=sample.trace.prompt_messages,
                completion=sample.trace.response_messages,
                input_ids=np.asarray(sample.prompt_ids + sample.response_ids, dtype=np.int64),
                completion_mask=np.asarray([0] * num_prompt + sample.loss_mask, dtype=np.int64),
                old_log_probs=np.asarray(
                    [0.0] * num_prompt + sample.response_logprobs, dtype=np.float32
                ),
                advantage=float(advantage),
                model_version=policy_version,
                group_id=group_id,
                metrics={"reward": sample.reward, "reward_std": float(rewards.std())},
                enqueued_at=enqueued_at,
            )
        )
    return rows


class RolloutWorker:
    """TRL's ``RolloutWorkerProtocol`` over a rolloutd buffer.

    A daemon thread takes batches from the buffer (``take``), turns each whole group into
    ``RolloutSample`` rows (:func:`rollout_samples`) on :attr:`rollout_buffer`, then
    acknowledges the batch. A group that is not whole (rolloutd could not replace its failed
    sessions) is left out whole and counted in :attr:`stats`. ``update_model_version`` moves
    the buffer's policy version, so the buffer drops groups older than its ``max_staleness``.

    Args:
        buffer: the buffer (``SyncRolloutBuffer``-like: blocking ``take``, ``ack``,
            ``set_policy_version``).
        load: ``SessionResult -> Trajectory`` (the client's ``trajectory``).
        num_groups: groups per take.
        take_timeout_s: one ``take``'s wait, s; the thread heartbeats between takes.

    Attributes:
        rollout_buffer: ``queue.Queue`` of ``RolloutSample``, drained by the trainer.
        metrics_queue: ``queue.Queue`` of ``{name: float}`` (groups and left-out counts).
        stats: :class:`BridgeStats`.
    """

    def __init__(
        self,
        buffer: Any,
        load: Callable[[Any], Any],
        *,
        num_groups: int = 1,
        take_timeout_s: float = 30.0,
    ) -> None:
        self.buffer = buffer
        self.load = load
        self.num_groups = num_groups
        self.take_timeout_s = take_timeout_s
        self.rollout_buffer: queue.Queue[RolloutSample] = queue.Queue()
        self.metrics_queue: queue.Queue[dict[str, float]] = queue.Queue()
        self.stats = BridgeStats()
        self.model_version = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._heartbeat = time.time()
        self._error: BaseException | None = None
        self._next_group_id = 0

    def start(self) -> None:
        """Start taking batches (TRL calls it once, after the first weight sync)."""
        if self._thread is not None:
            return
        self._heartbeat = time.time()
        self._thread = threading.Thread(target=self._loop, name="rolloutd-rollout-worker")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        """Stop taking batches; a batch taken and not yet queued is not acknowledged, so the
        buffer offers it again after its lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.take_timeout_s + 10)
            self._thread = None

    def update_model_version(self, model_version: int) -> None:
        """The trainer's live policy version: the buffer's staleness bound follows it."""
        self.model_version = int(model_version)
        self.buffer.set_policy_version(self.model_version)

    def check_health(self, stale_after_s: float) -> None:
        """Raise when the worker thread died or has not come back from a take in time.

        Raises:
            RuntimeError: naming the worker's error, or the heartbeat's age.
        """
        if self._error is not None:
            raise RuntimeError(f"rolloutd rollout worker failed: {self._error!r}") from (
                self._error
            )
        age = time.time() - self._heartbeat
        if age > stale_after_s:
            raise RuntimeError(f"rolloutd rollout worker heartbeat stale: {age:.0f} s")

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._heartbeat = time.time()
                try:
                    batch = self.buffer.take(self.num_groups, timeout_s=self.take_timeout_s)
                except TimeoutError:
                    continue
                if self._stop.is_set():
                    return
                self._put(batch)
                self.buffer.ack(batch.batch_id)
        except BaseException as e:  # noqa: BLE001 - reported by check_health, in TRL's thread
            self._error = e
            log.exception("trl_rollout_worker_failed")

    def _put(self, batch: Any) -> None:
        now = time.time()
        for buffered in batch.groups:
            group = group_samples(buffered.group, self.load)
            self.stats.add(group, masked=not group.whole)
            if not group.whole:
                continue
            for row in rollout_samples(
                group,
                policy_version=buffered.policy_version,
                group_id=self._next_group_id,
                enqueued_at=now,
            ):
                self.rollout_buffer.put(row)
            self._next_group_id += 1
        self.metrics_queue.put(
            {
                "rolloutd/groups_left_out": float(self.stats.num_groups_masked),
                "rolloutd/sessions_left_out": float(self.stats.num_sessions_left_out),
            }
        )


class WeightTransfer:
    """TRL's ``WeightTransferProtocol`` through rolloutd's weight sync to the engine.

    ``pause`` drains and pauses the gateway's backends; ``send_weights`` gathers the named
    tensors, writes them as a GGUF (the catalog model's GGUF as template) and makes every
    loader load it; ``resume`` stamps the next ``policy_version`` and resumes. The tensors
    arrive under Hugging Face names, as TRL's own transfer sends them.

    Args:
        sync: rolloutd's weight sync.
        run: runs its coroutines from the trainer's thread.
        template: the catalog model's GGUF.
        out_dir: where the GGUFs go.
        first_version: the version the first transfer stamps.

    Attributes:
        policy_version: the last version stamped (``first_version - 1`` before any).
    """

    def __init__(
        self,
        sync: WeightSync,
        run: Callable[[Any], Any],
        template: str | Path,
        out_dir: str | Path,
        *,
        first_version: int = 1,
    ) -> None:
        self.sync = sync
        self.run = run
        self.template = Path(template)
        self.out_dir = Path(out_dir)
        self.policy_version = first_version - 1
        self._pending: Path | None = None

    def init_weight_transfer(self) -> None:
        """Nothing to set up: the gateway's admin API is stateless."""
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def pause(self) -> None:
        """Pause the backends (calls in flight drain first)."""
        self.run(self.sync.begin())

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        """Write ``(name, tensor)`` pairs as a GGUF and load it on every server.

        Raises:
            rolloutd.trainer_client.weight_sync.WeightSyncError: a server did not load it
                (the backends stay paused).
        """
        state = {name: tensor.detach().to("cpu") for name, tensor in iterator}
        version = self.policy_version + 1
        path = export_gguf(state, self.template, self.out_dir / f"policy-{version}.gguf")
        self.run(self.sync.push(path, version))
        self._pending = path

    def resume(self) -> None:
        """Stamp the next policy version and resume the backends."""
        version = self.policy_version + 1
        self.run(self.sync.end(version))
        self.policy_version = version
        for old in self.out_dir.glob("policy-*.gguf"):
            if old != self._pending:
                old.unlink(missing_ok=True)

    def destroy(self) -> None:
        """Nothing to release (the admin client belongs to the caller)."""
