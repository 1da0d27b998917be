"""SkyRL bridge: a ``GeneratorInterface`` whose ``generate`` runs rolloutd sessions
(``skyrl`` 0.4.0, Python >= 3.12: scripts/setup_trainers.sh builds its environment).

Modelled on SkyRL's own generators (``skyrl.train.generators.skyrl_gym_generator``) and its
Harbor integration: SkyRL hands a batch whose prompts are repeated ``n_samples_per_prompt``
times, each with a ``TrajectoryID(instance_id, repetition_id)``; every distinct
``instance_id`` becomes one rolloutd task with as many samples as it has repetitions, its task
fields taken from the row's ``env_extras["rolloutd_task"]`` (harness, runtime, evaluator, ...;
the instruction defaults to the last user message of the prompt). The answer is SkyRL's
``GeneratorOutput``, one row per input row in the input's order: ``prompt_token_ids``,
``response_ids``, ``loss_masks`` (the trace's ``loss_mask``: 1 on sampled tokens, 0 on tool
and environment tokens), ``rollout_logprobs``, scalar ``rewards``, ``stop_reasons`` (the last
completion's finish reason), ``trajectory_ids`` as given and ``rollout_metrics`` (the
bridge's counts).

Failed sessions: rolloutd replaces sessions that failed for infrastructure (the task's
``max_replacements``); a group still not whole is **masked whole**: every row of it has an
all-zero loss mask, so no token of it is trained, and the reward 0.0 on each of its rows
(SkyRL's ``rewards`` has no missing value) is the same for the whole group, so its GRPO
advantages are 0 and no other group's baseline includes it. ``rollout_metrics`` counts groups
masked and sessions left out. A sample without any tokens (a failed session) is one
end-of-sequence token.

Who owns what: SkyRL owns training and weights; rolloutd owns inference (its gateway and
backends), sandboxes, sessions and rewards. Reference: SkyRL ``skyrl/train/generators/
base.py`` (``GeneratorInput``, ``GeneratorOutput``, ``TrajectoryID``) and
``skyrl/train/utils/trainer_utils.py`` (``validate_generator_output``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from skyrl.train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput

from rolloutd.routes import load_routes
from rolloutd.trainer_client.bridges.common import BridgeStats, group_samples, instruction_of
from rolloutd.trainer_client.client import RolloutClient

__all__ = ["TASK_EXTRA", "RolloutdGenerator"]

#: the ``env_extras`` key holding a row's rolloutd task fields
TASK_EXTRA = "rolloutd_task"


class RolloutdGenerator(GeneratorInterface):
    """SkyRL's generator interface over rolloutd tasks.

    Args:
        client: the trainer client (with its blob store).
        task_prefix: task ids are ``{task_prefix}-{call}-{instance_id}`` (the instance id
            made task-id safe).
        eos_token_id: the token of a row that has no tokens (a failed session in a masked
            group).
        defaults: task fields every task gets unless its row sets them.

    Attributes:
        stats: cumulative :class:`~rolloutd.trainer_client.bridges.common.BridgeStats`.
    """

    def __init__(
        self,
        client: RolloutClient,
        *,
        task_prefix: str,
        eos_token_id: int,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.task_prefix = task_prefix
        self.eos_token_id = eos_token_id
        self.defaults = dict(defaults or {})
        self.stats = BridgeStats()
        self._calls = 0

    def _task_requests(
        self, prompts: Sequence[Any], ids: Sequence[Any], extras: Sequence[Any]
    ) -> tuple[dict[str, list[int]], list[dict[str, Any]]]:
        """Group the batch's rows by SkyRL instance, one rolloutd task per group.

        Args:
            prompts: the batch's N prompts.
            ids: its N ``TrajectoryID``s (``instance_id``, ``repetition_id``).
            extras: its N ``env_extras``, each with ``rolloutd_task``.

        Returns:
            ``(rows_of, requests)``: the rows of each instance in batch order, and one task
            request per instance in the same order (``num_samples`` = its number of rows).

        Raises:
            ValueError: a row without task fields, or one instance whose rows name different
                tasks.
        """
        rows_of: dict[str, list[int]] = {}
        for row, trajectory_id in enumerate(ids):
            rows_of.setdefault(trajectory_id.instance_id, []).append(row)
        requests = []
        for number, (instance, rows) in enumerate(rows_of.items()):
            fields = extras[rows[0]].get(TASK_EXTRA) if extras[rows[0]] else None
            if not isinstance(fields, Mapping):
                raise ValueError(f"row {rows[0]}: env_extras has no {TASK_EXTRA!r} mapping")
            if any((extras[r] or {}).get(TASK_EXTRA) != fields for r in rows):
                raise ValueError(f"instance {instance!r}: its rows name different tasks")
            requests.append(
                {
                    "instruction": instruction_of(prompts[rows[0]]),
                    **self.defaults,
                    **fields,
                    "task_id": f"{self.task_prefix}-{self._calls}-{number}",
                    "num_samples": len(rows),
                    "metadata": {**dict(fields.get("metadata") or {}), "instance_id": instance},
                }
            )
        return rows_of, requests

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        """Run the batch's groups as rolloutd tasks.

        Args:
            input_batch: SkyRL's ``GeneratorInput``: N ``prompts``, ``env_extras`` (each with
                ``rolloutd_task``), ``trajectory_ids`` (required: they name the groups).

        Returns:
            SkyRL's ``GeneratorOutput`` with N rows, in the input's order.

        Raises:
            ValueError: no ``trajectory_ids``, a row without task fields, or one instance
                whose rows name different tasks.
        """
        prompts = input_batch["prompts"]
        ids = input_batch.get("trajectory_ids")
        extras = input_batch.get("env_extras") or [{}] * len(prompts)
        if not ids or len(ids) != len(prompts):
            raise ValueError("RolloutdGenerator needs one trajectory id per prompt")
        self._calls += 1
        rows_of, requests = self._task_requests(prompts, ids, extras)
        handles = [await self.client.submit(r) for r in requests]
        groups = await asyncio.gather(*(h.result() for h in handles))

        num_rows = len(prompts)
        out: dict[str, list[Any]] = {
            "prompt_token_ids": [[]] * num_rows,
            "response_ids": [[]] * num_rows,
            "rewards": [0.0] * num_rows,
            "loss_masks": [[]] * num_rows,
            "stop_reasons": [""] * num_rows,
            "rollout_logprobs": [[]] * num_rows,
            "rollout_expert_indices": [None] * num_rows,
        }
        masked_before = self.stats.num_groups_masked
        for rows, group in zip(rows_of.values(), groups, strict=True):
            store = self.client.store
            routes = partial(load_routes, store) if store is not None else None
            samples = group_samples(group, self.client.trajectory, len(rows), routes)
            masked = not samples.whole
            self.stats.add(samples, masked=masked)
            # the group's rows in repetition order get its sessions in sample order
            ordered = sorted(rows, key=lambda r: ids[r].repetition_id)
            for position, row in enumerate(ordered):
                if position < len(samples.samples):
                    sample = samples.samples[position]
                    out["prompt_token_ids"][row] = sample.prompt_ids
                    out["response_ids"][row] = sample.response_ids
                    out["loss_masks"][row] = (
                        [0] * len(sample.loss_mask) if masked else sample.loss_mask
                    )
                    out["rollout_logprobs"][row] = sample.response_logprobs
                    out["rollout_expert_indices"][row] = sample.routed_experts
                    out["rewards"][row] = 0.0 if masked else sample.reward
                    out["stop_reasons"][row] = sample.finish_reason
                else:
                    out["prompt_token_ids"][row] = [self.eos_token_id]
                    out["response_ids"][row] = [self.eos_token_id]
                    out["loss_masks"][row] = [0]
                    out["rollout_logprobs"][row] = [0.0]
                    out["rewards"][row] = 0.0
                    out["stop_reasons"][row] = "failed"
        scored = [r for r, m in zip(out["rewards"], out["loss_masks"], strict=True) if any(m)]
        totals = {k: v for k, v in self.stats.as_dict().items() if k != "left_out_by_reason"}
        metrics = {
            "rolloutd/num_groups": len(groups),
            "rolloutd/num_groups_masked": self.stats.num_groups_masked - masked_before,
            "rolloutd/mean_reward": sum(scored) / len(scored) if scored else None,
            **{f"rolloutd/total_{k}": v for k, v in totals.items()},
        }
        return GeneratorOutput(
            prompt_token_ids=out["prompt_token_ids"],
            response_ids=out["response_ids"],
            rewards=out["rewards"],
            loss_masks=out["loss_masks"],
            stop_reasons=out["stop_reasons"],
            rollout_metrics=metrics,
            rollout_logprobs=out["rollout_logprobs"],
            trajectory_ids=list(ids),
            trajectory_generation_times=None,
            trajectory_time_splits=None,
            # SkyRL's R3 field: per row, routes of a prefix of prompt and response tokens;
            # None unless every row has them
            rollout_expert_indices=(
                out["rollout_expert_indices"]
                if all(r is not None for r in out["rollout_expert_indices"])
                else None
            ),
            rollout_sample_support=None,
            is_last_step=None,
            env_metrics=None,
            pixel_values=None,
            image_grid_thw=None,
        )
