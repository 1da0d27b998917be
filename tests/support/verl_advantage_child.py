"""verl 0.9.1's own advantage computation over a batch with left-out rows, run by verl's own
environment's Python (scripts/setup_trainers.sh) with
``VERL_USE_EXTERNAL_MODULES=rolloutd.trainer_client.bridges.verl``, as a trainer's process is
configured (docs/trainers.md).

What is verl's: ``import verl`` importing the bridge (its external-modules switch), its
estimator registry, ``verl.trainer.ppo.ray_trainer.compute_advantage`` (the function both of
verl's trainers call for every estimator but GRPO's multi-output case, which the v1 trainer's
``compute_advantage_for_multi_trajectories`` hands on to it for any other estimator),
``AgentLoopOutput.as_dict`` (the tensors verl trains on), ``DataProto`` and the legacy
trainer's ``AgentLoopWorker._postprocess`` then ``DataProto.union``. The rows are built here:
scored rows as ``AgentLoopOutput``s, left-out rows by the bridge's own ``left_out_output``.

Prints one JSON line: whether the estimator was registered by ``import verl`` alone, each row's
group and whether it is left out, the per-row advantage (on its first trainable token, else 0)
of each case, whether every advantage is 0 off the mask, and what ``union`` said to an output
carrying a ``uid`` of its own.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

#: (group, reward or None for a left-out row, response mask); the left-out rows sit between
#: their siblings, and group "c" has nothing but a left-out row
ROWS: list[tuple[str, float | None, list[int]]] = [
    ("a", 1.0, [1, 1, 1]),
    ("a", None, [0, 0, 0, 0, 0]),
    ("b", 0.5, [1, 1]),
    ("a", 0.0, [1, 1, 0, 0, 1]),  # a tool turn (mask 0) between two sampled runs
    ("a", 1.0, [1]),
    ("c", None, [0]),
    ("b", 0.25, [1, 1, 1, 1]),
]


def outputs() -> list[Any]:
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    from rolloutd.trainer_client.bridges.verl import left_out_output

    made = []
    for number, (_, reward, mask) in enumerate(ROWS):
        prompt, response = [7, 8], [100 + number] * len(mask)
        if reward is None:
            made.append(
                left_out_output(prompt, response, reason="backend", metrics=AgentLoopMetrics())
            )
        else:
            made.append(
                AgentLoopOutput(
                    prompt_ids=prompt,
                    response_ids=response,
                    response_mask=mask,
                    response_logprobs=[-0.5 * m for m in mask],
                    reward_score=reward,
                    num_turns=2,
                    metrics=AgentLoopMetrics(),
                )
            )
    return made


def batch(rows: list[int]) -> Any:
    """verl's ``DataProto`` of the chosen rows: each output's own ``as_dict`` tensors,
    right-padded to the longest response; ``uid`` the row's group."""
    from verl.protocol import DataProto

    made = outputs()
    dicts = [made[i].as_dict() for i in rows]
    width = max(len(d["response_mask"]) for d in dicts)

    def padded(key: str) -> torch.Tensor:
        return torch.stack(
            [torch.nn.functional.pad(d[key], (0, width - len(d[key]))) for d in dicts]
        )

    return DataProto.from_dict(
        tensors={
            "responses": padded("responses"),
            "response_mask": padded("response_mask"),
            "token_level_rewards": padded("rm_scores"),
        },
        non_tensors={"uid": np.array([ROWS[i][0] for i in rows], dtype=object)},
    )


def advantages(rows: list[int], estimator: str, norm: bool) -> dict[str, Any]:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.ray_trainer import compute_advantage

    data = compute_advantage(
        batch(rows),
        adv_estimator=estimator,
        norm_adv_by_std_in_grpo=norm,
        config=OmegaConf.create({"norm_adv_by_std_in_grpo": norm}),
    )
    adv, mask = data.batch["advantages"], data.batch["response_mask"]
    per_row = {}
    for position, row in enumerate(rows):
        trainable = mask[position].nonzero()
        per_row[row] = float(adv[position, trainable[0, 0]]) if len(trainable) else 0.0
    return {"per_row": per_row, "zero_off_mask": bool((adv[mask == 0] == 0).all())}


def union_with_own_uid(own: bool) -> str:
    """The legacy trainer's path for a left-out row with a ``uid`` of its own in
    ``extra_fields``: ``AgentLoopWorker._postprocess`` (which lays extra fields over the
    prompt's non-tensor columns) then ``batch.union`` with the trainer's repeated batch."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, _InternalAgentLoopOutput
    from verl.protocol import DataProto

    made, width = outputs(), 5
    uids = np.array([group for group, _, _ in ROWS], dtype=object)
    internal = []
    for number, output in enumerate(made):
        pad = width - len(output.response_ids)
        response_mask = torch.tensor([output.response_mask + [0] * pad])
        attention = torch.tensor([[1, 1] + [1] * len(output.response_ids) + [0] * pad])
        uid = f"own-{number}" if own and ROWS[number][1] is None else str(uids[number])
        internal.append(
            _InternalAgentLoopOutput(
                prompt_ids=torch.tensor([output.prompt_ids]),
                response_ids=torch.tensor([output.response_ids + [0] * pad]),
                input_ids=torch.tensor([output.prompt_ids + output.response_ids + [0] * pad]),
                position_ids=torch.clip(torch.cumsum(attention, dim=-1) - 1, min=0),
                response_mask=response_mask,
                attention_mask=attention,
                reward_score=output.reward_score,
                num_turns=output.num_turns,
                metrics=output.metrics,
                extra_fields={**output.extra_fields, "uid": uid},
            )
        )
    worker = SimpleNamespace(reward_loop_worker_handles=None)
    generated = AgentLoopWorker._postprocess(worker, internal, input_non_tensor_batch={"uid": uids})
    trainer_batch = DataProto.from_dict(
        tensors={"index": torch.arange(len(ROWS))}, non_tensors={"uid": uids.copy()}
    )
    try:
        merged = trainer_batch.union(generated)
    except AssertionError as e:
        return f"AssertionError: {e}"
    return "ok: " + ",".join(merged.non_tensor_batch["uid"])


def main() -> None:
    import verl  # noqa: F401 - imports the bridge through VERL_USE_EXTERNAL_MODULES
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    registered = {
        "estimator": "rolloutd_grpo" in ADV_ESTIMATOR_REGISTRY,
        "agent_loop": "rolloutd" in _agent_loop_registry,
    }
    every = list(range(len(ROWS)))
    kept = [i for i, (_, reward, _) in enumerate(ROWS) if reward is not None]
    cases = {}
    for norm in (True, False):
        cases[f"norm={norm}"] = {
            "grpo_without": advantages(kept, "grpo", norm),
            "grpo_with": advantages(every, "grpo", norm),
            "rolloutd_without": advantages(kept, "rolloutd_grpo", norm),
            "rolloutd_with": advantages(every, "rolloutd_grpo", norm),
        }
    print(
        json.dumps(
            {
                "registered": registered,
                "rows": [[group, reward is None] for group, reward, _ in ROWS],
                "cases": cases,
                "union": {
                    "prompt_uid": union_with_own_uid(False),
                    "own_uid": union_with_own_uid(True),
                },
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
