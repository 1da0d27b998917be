"""TRL bridge, asynchronous half: ``trl.experimental.async_grpo.AsyncGRPOTrainer``'s two
protocols over rolloutd (``pip install 'rolloutd[trl]'``, tested against ``trl`` 1.16.0).

:class:`RolloutWorker` implements ``RolloutWorkerProtocol`` over rolloutd's durable buffer
(start, stop, ``update_model_version``, ``check_health``, ``RolloutSample`` rows with the
policy version and group id); :class:`WeightTransfer` implements ``WeightTransferProtocol``
through rolloutd's weight sync (pause, GGUF to the engine, resume with a new
``policy_version``). The synchronous ``GRPOTrainer`` bridge is
:mod:`rolloutd.trainer_client.bridges.trl`.

Reference: TRL ``trl/experimental/async_grpo/async_grpo_trainer.py`` (the two protocols) and
``async_rollout_worker.py`` (``RolloutSample``, ``TrainingSequence``, advantages
``(r - mean) / (std + 1e-8)`` over the scored rewards of a group).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

from rolloutd.trainer_client.bridges.common import BridgeStats, GroupSamples, group_samples
from rolloutd.trainer_client.tracking import rollout_stats
from rolloutd.trainer_client.training.gguf_export import export_gguf
from rolloutd.trainer_client.training.weight_sync import WeightSync

log = structlog.get_logger(__name__)

__all__ = ["RolloutWorker", "WeightTransfer", "rollout_samples"]


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
        metrics_queue: ``queue.Queue`` of ``{name: float}``, one per batch: its rollout
            statistics (:func:`~rolloutd.trainer_client.tracking.rollout_stats`, staleness
            against the buffer's version at hand-out, ``Batch.policy_version``) and the
            cumulative :class:`BridgeStats` (``rolloutd/bridge/...``); TRL's trainer logs
            them in its ``log``.
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
        num_masked = 0
        for buffered in batch.groups:
            group = group_samples(buffered.group, self.load)
            self.stats.add(group, masked=not group.whole)
            if not group.whole:
                num_masked += 1
                continue
            for row in rollout_samples(
                group,
                policy_version=buffered.policy_version,
                group_id=self._next_group_id,
                enqueued_at=now,
            ):
                self.rollout_buffer.put(row)
            self._next_group_id += 1
        stats = rollout_stats(
            [b.group for b in batch.groups],
            policy_version=batch.policy_version,
            start_versions=[b.policy_version for b in batch.groups],
            groups_left_out={"masked": num_masked},
        )
        self.metrics_queue.put({**stats.metrics(), **self.stats.metrics()})


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
            rolloutd.trainer_client.training.weight_sync.WeightSyncError: a server did not load it
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
