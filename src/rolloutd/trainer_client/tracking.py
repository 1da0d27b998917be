"""Rollout statistics in the team's tracker: TensorBoard, Weights & Biases, MLflow.

What a training loop, a buffer's consumer or an evaluation logs per batch of groups
(:func:`rollout_stats`, :meth:`RolloutStats.metrics`), every name under ``rolloutd/``:

- ``reward_mean``, ``reward_std`` (population) and ``pass_rate`` (share of rewards >= the pass
  reward) over the scored sessions (:func:`rolloutd.scoring.is_scored`: a session that failed
  for the infrastructure has no reward and is never averaged in);
- ``failures/{kind}`` for every failure kind (0 included, so each curve is continuous), a
  judge's failure apart as ``failures/evaluator/judge``, counted by
  :func:`rolloutd.scoring.failure_counts` as every summary counts them;
- ``groups_left_out`` (and ``groups_left_out/{reason}``: what the buffer dropped since the last
  batch, or what a bridge masked), ``replacements``;
- ``turns_per_session`` (model calls), ``tokens_per_session`` (trainable tokens),
  ``session_wall_s`` (a session's phases, mean) and ``rollout_wall_s`` (the batch's wait, when
  the caller measured it);
- ``staleness_mean`` and ``staleness_max`` (the buffer's own rule,
  :func:`rolloutd.workflows.buffer.rules.group_staleness`: the version now minus each group's
  token-weighted policy version) and ``policy_version``;
- ``num_groups``, ``num_sessions``, ``num_scored``.

A table of sample trajectories (task, sample, reward, failure, turns, tokens, link to the
trace viewer's session page) goes with :meth:`RolloutTracker.log_samples`: a W&B ``Table``, a
TensorBoard text summary (a Markdown table, which its text plugin renders), an MLflow table
artifact.

Each tracker package is imported when its tracker is opened, never at module level, so the
client stays light without them: ``pip install 'rolloutd[tensorboard]'`` (the ``tensorboard``
package's own event writer, as ``torch.utils.tensorboard`` uses it), ``'rolloutd[wandb]'``
(``wandb.init``; ``WANDB_MODE=offline`` writes the run under ``log_dir`` without an account),
``'rolloutd[mlflow]'`` (``mlflow-skinny`` with SQLAlchemy and Alembic for its SQLite store;
``MLFLOW_TRACKING_URI``, else ``log_dir/mlflow.db``).

Trainers with their own logging take the same numbers: the TRL bridge hands them to TRL's
``log_metric`` (:mod:`rolloutd.trainer_client.bridges.trl`), so ``report_to="tensorboard"`` or
``"wandb"`` shows them beside TRL's own.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, get_args
from urllib.parse import quote

from rolloutd.records import FailureKind
from rolloutd.scoring import JUDGE_FAILURE, failure_counts, failure_key, failure_of, is_scored
from rolloutd.types import TaskResult
from rolloutd.workflows.buffer.models import Batch, BufferStats
from rolloutd.workflows.buffer.rules import group_staleness

__all__ = [
    "PREFIX",
    "SAMPLE_COLUMNS",
    "TRACKERS",
    "RolloutStats",
    "RolloutTracker",
    "TrackerName",
    "rollout_stats",
    "sample_rows",
    "session_url",
]

#: the prefix of every metric name
PREFIX = "rolloutd/"
#: the trackers :class:`RolloutTracker` writes to
TrackerName = Literal["tensorboard", "wandb", "mlflow"]
TRACKERS: tuple[str, ...] = get_args(TrackerName)
#: the columns of the sample table (:func:`sample_rows`)
SAMPLE_COLUMNS = ("task", "sample", "reward", "failure", "turns", "tokens", "viewer")
#: the buffer's counters of groups it did not hand out, by reason
#: (:class:`rolloutd.workflows.buffer.models.BufferState`)
DROP_COUNTERS = {
    "zero_variance": "num_dropped_zero_variance",
    "stale": "num_dropped_stale",
    "incomplete": "num_dropped_incomplete",
}


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


@dataclass
class RolloutStats:
    """One batch's rollout statistics (:func:`rollout_stats`).

    Attributes:
        num_groups / num_sessions / num_scored: groups, their sessions (the last attempt of
            each sample), and those whose reward counts.
        reward_mean / reward_std: over the scored rewards (population std); None without one.
        pass_rate: share of scored rewards >= the pass reward; None without one.
        failures: failure kind -> sessions (every kind, 0 included; a judge's failure under
            ``evaluator/judge``, not ``evaluator``).
        groups_left_out: reason -> groups not handed to the trainer (dropped, masked).
        num_replacements: sessions started to replace failed ones.
        turns_per_session / tokens_per_session: mean model calls and trainable tokens.
        session_wall_s: mean of each session's phase durations, seconds.
        rollout_wall_s: the batch's wait as the caller measured it, seconds (None: not given).
        staleness_mean / staleness_max: versions (None without a policy version).
        policy_version: the trainer's or buffer's version now (None: not given).
    """

    num_groups: int = 0
    num_sessions: int = 0
    num_scored: int = 0
    reward_mean: float | None = None
    reward_std: float | None = None
    pass_rate: float | None = None
    failures: dict[str, int] = field(default_factory=dict)
    groups_left_out: dict[str, int] = field(default_factory=dict)
    num_replacements: int = 0
    turns_per_session: float | None = None
    tokens_per_session: float | None = None
    session_wall_s: float | None = None
    rollout_wall_s: float | None = None
    staleness_mean: float | None = None
    staleness_max: float | None = None
    policy_version: int | None = None

    def metrics(self, prefix: str = PREFIX) -> dict[str, float]:
        """The statistics as ``{name: value}`` (names in the module docstring); a figure
        that is None is left out, never logged as 0."""
        values: dict[str, float | None] = {
            "num_groups": self.num_groups,
            "num_sessions": self.num_sessions,
            "num_scored": self.num_scored,
            "reward_mean": self.reward_mean,
            "reward_std": self.reward_std,
            "pass_rate": self.pass_rate,
            "groups_left_out": sum(self.groups_left_out.values()),
            "replacements": self.num_replacements,
            "turns_per_session": self.turns_per_session,
            "tokens_per_session": self.tokens_per_session,
            "session_wall_s": self.session_wall_s,
            "rollout_wall_s": self.rollout_wall_s,
            "staleness_mean": self.staleness_mean,
            "staleness_max": self.staleness_max,
            "policy_version": self.policy_version,
        }
        values.update({f"failures/{k}": n for k, n in self.failures.items()})
        values.update({f"groups_left_out/{k}": n for k, n in self.groups_left_out.items()})
        return {f"{prefix}{k}": float(v) for k, v in values.items() if v is not None}


def rollout_stats(
    groups: Iterable[TaskResult],
    *,
    policy_version: int | None = None,
    start_versions: Sequence[int | None] | None = None,
    groups_left_out: Mapping[str, int] | None = None,
    rollout_wall_s: float | None = None,
    pass_reward: float = 1.0,
) -> RolloutStats:
    """The statistics of one batch of finished groups.

    Args:
        groups: the batch's groups (whole: their ``sessions``, the last attempt of each
            sample).
        policy_version: the version now (the buffer's at hand-out, the trainer's step); with
            it, each group's staleness
            (:func:`rolloutd.workflows.buffer.rules.group_staleness`).
        start_versions: per group, the version its task started under (a buffer's
            ``BufferedGroup.policy_version``), for a group without trainable tokens.
        groups_left_out: reason -> groups of this batch's making not handed to the trainer.
        rollout_wall_s: the batch's wait, seconds.
        pass_reward: the reward from which a sample passes.

    Returns:
        :class:`RolloutStats`.
    """
    groups = list(groups)
    sessions = [s for g in groups for s in g.sessions]
    rewards = [float(s.reward) for s in sessions if is_scored(s)]  # type: ignore[arg-type]
    failures = dict.fromkeys((*get_args(FailureKind), JUDGE_FAILURE), 0)
    failures.update(failure_counts(sessions))
    starts = list(start_versions) if start_versions is not None else [None] * len(groups)
    staleness = []
    if policy_version is not None:
        for group, start in zip(groups, starts, strict=True):
            if group.token_weighted_policy_version is not None or start is not None:
                # the start version counts only for a group without a trainable token
                staleness.append(group_staleness(group, start or 0, policy_version))
    return RolloutStats(
        num_groups=len(groups),
        num_sessions=len(sessions),
        num_scored=len(rewards),
        reward_mean=_mean(rewards),
        reward_std=statistics.pstdev(rewards) if rewards else None,
        pass_rate=_mean([float(r >= pass_reward) for r in rewards]),
        failures=failures,
        groups_left_out=dict(groups_left_out or {}),
        num_replacements=sum(g.num_replacements for g in groups),
        turns_per_session=_mean([s.num_completions for s in sessions]),
        tokens_per_session=_mean([s.num_trainable_tokens for s in sessions]),
        session_wall_s=_mean([sum(p.duration_s for p in s.phases) for s in sessions]),
        rollout_wall_s=rollout_wall_s,
        staleness_mean=_mean(staleness),
        staleness_max=max(staleness) if staleness else None,
        policy_version=policy_version,
    )


def session_url(viewer_url: str, session_id: str) -> str:
    """The trace viewer's page of a session (``GET /view/session/{session_id}`` on the REST
    facade, :mod:`rolloutd.viewer.routes`)."""
    return f"{viewer_url.rstrip('/')}/view/session/{quote(session_id, safe='/')}"


def sample_rows(
    groups: Iterable[TaskResult], *, viewer_url: str | None = None, max_rows: int = 8
) -> list[list[Any]]:
    """Rows of the sample table (:data:`SAMPLE_COLUMNS`), one per session, the groups' first
    sessions first (one of each group before a second of any).

    Args:
        groups: finished groups.
        viewer_url: the trace viewer's base URL (the REST facade's); None: no link.
        max_rows: at most this many rows.
    """
    groups = list(groups)
    order = sorted((i, j) for j, g in enumerate(groups) for i in range(len(g.sessions)))
    rows: list[list[Any]] = []
    for i, j in order[:max_rows]:
        s = groups[j].sessions[i]
        failure = failure_of(s)
        rows.append(
            [
                s.task_id,
                s.sample_index,
                s.reward,
                failure_key(failure) if failure is not None else "",
                s.num_completions,
                s.num_trainable_tokens,
                session_url(viewer_url, s.session_id) if viewer_url else "",
            ]
        )
    return rows


class _Writer(Protocol):
    """What one tracker does for :class:`RolloutTracker`."""

    def scalars(self, metrics: Mapping[str, float], step: int) -> None: ...

    def table(
        self, name: str, columns: Sequence[str], rows: list[list[Any]], step: int
    ) -> None: ...

    def close(self) -> None: ...


class _TensorBoard:
    """Event files under ``log_dir`` through the ``tensorboard`` package's own writer (the
    one ``torch.utils.tensorboard.SummaryWriter`` wraps): scalars as ``simple_value``, a table
    as a text summary holding a Markdown table (TensorBoard's text plugin)."""

    def __init__(self, log_dir: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.writer = EventFileWriter(str(log_dir))

    def _add(self, values: list[Any], step: int) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        summary = summary_pb2.Summary(value=values)
        self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def scalars(self, metrics: Mapping[str, float], step: int) -> None:
        from tensorboard.compat.proto import summary_pb2

        self._add(
            [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in metrics.items()], step
        )
        self.writer.flush()

    def table(self, name: str, columns: Sequence[str], rows: list[list[Any]], step: int) -> None:
        from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2
        from tensorboard.plugins.text import plugin_data_pb2

        def cell(value: Any) -> str:
            if isinstance(value, str) and value.startswith("http"):
                return f"[open]({value})"
            return "-" if value in (None, "") else str(value).replace("|", "\\|")

        lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(
                plugin_name="text",
                content=plugin_data_pb2.TextPluginData(version=0).SerializeToString(),
            )
        )
        tensor = tensor_pb2.TensorProto(
            dtype="DT_STRING",
            string_val=["\n".join(lines).encode()],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]
            ),
        )
        self._add([summary_pb2.Summary.Value(tag=name, metadata=metadata, tensor=tensor)], step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    """A W&B run (``wandb.init``): scalars with ``run.log(..., step=)``, a table as a
    ``wandb.Table``. ``WANDB_MODE=offline`` keeps it under ``log_dir/wandb``."""

    def __init__(
        self, log_dir: Path, project: str, run_name: str | None, config: Mapping[str, Any]
    ) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=project,
            name=run_name,
            dir=str(log_dir),
            config=dict(config),
            reinit="create_new",
        )

    def scalars(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def table(self, name: str, columns: Sequence[str], rows: list[list[Any]], step: int) -> None:
        self.run.log({name: self.wandb.Table(columns=list(columns), data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class _MLflow:
    """An MLflow run (``mlflow.start_run``): ``log_metrics`` per step, a table as a JSON
    artifact (``log_table``). ``MLFLOW_TRACKING_URI``, else a SQLite store
    ``log_dir/mlflow.db`` with artifacts in ``log_dir/mlartifacts``."""

    def __init__(
        self, log_dir: Path, project: str, run_name: str | None, config: Mapping[str, Any]
    ) -> None:
        import os

        import mlflow

        self.mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            # MLflow 3's local store (its file store is in maintenance mode), artifacts beside
            # it rather than under the working folder
            mlflow.set_tracking_uri(f"sqlite:///{(log_dir / 'mlflow.db').resolve()}")
            if mlflow.get_experiment_by_name(project) is None:
                mlflow.create_experiment(
                    project, artifact_location=(log_dir / "mlartifacts").resolve().as_uri()
                )
        mlflow.set_experiment(project)
        self.run = mlflow.start_run(run_name=run_name)
        if config:
            mlflow.log_params({k: str(v)[:500] for k, v in config.items()})

    def scalars(self, metrics: Mapping[str, float], step: int) -> None:
        self.mlflow.log_metrics(dict(metrics), step=step, run_id=self.run.info.run_id)

    def table(self, name: str, columns: Sequence[str], rows: list[list[Any]], step: int) -> None:
        data = {c: [row[i] for row in rows] for i, c in enumerate(columns)}
        self.mlflow.log_table(
            data, artifact_file=f"{name}/step-{step}.json", run_id=self.run.info.run_id
        )

    def close(self) -> None:
        self.mlflow.end_run()


class RolloutTracker:
    """Rollout statistics to one or more trackers, per batch.

    Args:
        trackers: ``tensorboard``, ``wandb``, ``mlflow``, several, or none (logs nothing).
        log_dir: where TensorBoard's event files, an offline W&B run and a local MLflow store
            go.
        project: the W&B project, the MLflow experiment.
        run_name: the run's name in W&B and MLflow.
        config: the run's configuration (W&B config, MLflow params).
        viewer_url: the trace viewer's base URL, for the sample table's links.
        pass_reward: the reward from which a sample passes (``pass_rate``).

    Raises:
        ValueError: an unknown tracker.
        ImportError: a tracker's package is not installed (naming the extra).

    Example::

        with RolloutTracker("tensorboard", log_dir="runs/a") as tracker:
            batch = await buffer.take(8)
            tracker.log_batch(batch, step=step, buffer_stats=await buffer.stats())
    """

    def __init__(
        self,
        trackers: str | Sequence[str] = "tensorboard",
        *,
        log_dir: str | Path = "runs",
        project: str = "rolloutd",
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        viewer_url: str | None = None,
        pass_reward: float = 1.0,
    ) -> None:
        names = [trackers] if isinstance(trackers, str) else list(trackers)
        unknown = [n for n in names if n not in TRACKERS]
        if unknown:
            raise ValueError(f"unknown tracker(s) {unknown}; known: {', '.join(TRACKERS)}")
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.viewer_url = viewer_url
        self.pass_reward = pass_reward
        self.writers: dict[str, _Writer] = {}
        self._dropped = dict.fromkeys(DROP_COUNTERS, 0)
        try:
            for name in names:
                self.writers[name] = self._open(name, project, run_name, dict(config or {}))
        except ImportError as e:
            self.close()
            raise ImportError(
                f"tracker {name!r} needs its package: pip install 'rolloutd[{name}]' ({e})"
            ) from e

    def _open(
        self, name: str, project: str, run_name: str | None, config: dict[str, Any]
    ) -> _Writer:
        if name == "tensorboard":
            return _TensorBoard(self.log_dir)
        if name == "wandb":
            return _Wandb(self.log_dir, project, run_name, config)
        return _MLflow(self.log_dir, project, run_name, config)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log scalars at ``step`` in every tracker (names as given)."""
        for writer in self.writers.values():
            writer.scalars(metrics, step)

    def log_batch(
        self,
        batch: Batch | Iterable[TaskResult],
        *,
        step: int,
        policy_version: int | None = None,
        buffer_stats: BufferStats | None = None,
        groups_left_out: Mapping[str, int] | None = None,
        rollout_wall_s: float | None = None,
        samples: int = 0,
        extra: Mapping[str, float] | None = None,
    ) -> RolloutStats:
        """Compute and log one batch's statistics (:func:`rollout_stats`).

        Args:
            batch: a buffer's batch (taken with the trainer client: whole groups; its
                ``policy_version`` and each group's start version give the staleness), or
                the groups themselves.
            step: the trainer's step.
            policy_version: the version now (default: the batch's at hand-out).
            buffer_stats: the buffer's stats after the take: the groups it dropped since the
                last call (the first call: since the buffer began) are logged as left out, by
                reason.
            groups_left_out: more groups left out, by reason (a bridge's masked groups).
            rollout_wall_s: the batch's wait, seconds.
            samples: also log a table of this many sample trajectories.
            extra: more scalars for the same step (names as given).

        Returns:
            The statistics logged.

        Raises:
            ValueError: a batch group without its ``group`` (take it with the trainer
                client, which reads the groups from the store).
        """
        if isinstance(batch, Batch):
            missing = [g.task_id for g in batch.groups if g.group is None]
            if missing:
                raise ValueError(f"batch {batch.batch_id}: groups {missing} were not read")
            groups = [g.group for g in batch.groups if g.group is not None]
            starts: list[int | None] = [g.policy_version for g in batch.groups]
            version = batch.policy_version if policy_version is None else policy_version
        else:
            groups = list(batch)
            starts = [None] * len(groups)
            version = policy_version
        left_out = dict(groups_left_out or {})
        if buffer_stats is not None:
            for reason, n in self._buffer_drops(buffer_stats).items():
                left_out[reason] = left_out.get(reason, 0) + n
        stats = rollout_stats(
            groups,
            policy_version=version,
            start_versions=starts,
            groups_left_out=left_out,
            rollout_wall_s=rollout_wall_s,
            pass_reward=self.pass_reward,
        )
        self.log({**stats.metrics(), **(extra or {})}, step)
        if samples:
            self.log_samples(groups, step=step, max_rows=samples)
        return stats

    def _buffer_drops(self, stats: BufferStats) -> dict[str, int]:
        """The groups the buffer dropped since the last call (the first: since it began), by
        reason."""
        now = {r: stats.state_counters.get(c, 0) for r, c in DROP_COUNTERS.items()}
        before, self._dropped = self._dropped, now
        return {r: now[r] - before[r] for r in now}

    def log_samples(self, groups: Iterable[TaskResult], *, step: int, max_rows: int = 8) -> None:
        """Log a table of sample trajectories (:func:`sample_rows`) as ``rolloutd/samples``."""
        rows = sample_rows(groups, viewer_url=self.viewer_url, max_rows=max_rows)
        for writer in self.writers.values():
            writer.table(f"{PREFIX}samples", SAMPLE_COLUMNS, rows, step)

    def close(self) -> None:
        """Flush and close every tracker (a W&B run is finished, an MLflow run ended)."""
        for writer in self.writers.values():
            writer.close()
        self.writers = {}

    def __enter__(self) -> RolloutTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
