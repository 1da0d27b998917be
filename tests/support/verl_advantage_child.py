"""verl 0.9.1's own advantage computation over the verl bridge's outputs, run by verl's own
environment's Python (scripts/setup_trainers.sh) with
``VERL_USE_EXTERNAL_MODULES=rolloutd.trainer_client.bridges.verl``, as a trainer's process is
configured (docs/trainers.md).

What is verl's: ``import verl`` importing the bridge (its external-modules switch), its agent
loop registry and ``hydra.utils.instantiate`` building ``RolloutdAgentLoop`` as its worker does,
its estimator registry, ``verl.trainer.ppo.ray_trainer.compute_advantage`` (the function both
of verl's trainers call for every estimator; the v1 trainer's
``compute_advantage_for_multi_trajectories`` hands any estimator but ``grpo`` on to it),
``AgentLoopOutput.as_dict`` (the tensors verl trains on), ``DataProto`` and the legacy
trainer's ``AgentLoopWorker._postprocess`` then ``DataProto.union``. The rolloutd side is the
stand-in client of ``tests/support/bridges.py`` (canned sessions, rolloutd's own types): one
task of one session per row, as verl runs the agent loop once per sample.

Prints one JSON line: whether ``import verl`` alone registered the estimator and the agent
loop, each row's group and why it was left out (None when it was not), the per-row advantage
(on its first trainable token, else 0) of each case, whether every advantage is 0 off the mask,
and what ``union`` said to outputs carrying a ``uid`` of their own.
"""

from __future__ import annotations

import asyncio
import json
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

#: (group, session, reward, trace's loss mask); a failed session and a scored one without a
#: sampled token are left out; they sit between their siblings, and group "c" has nothing but a
#: left-out row, group "d" none
ROWS: list[tuple[str, str, float | None, list[int]]] = [
    ("a", "scored", 1.0, [1, 1, 1]),
    ("a", "failed", None, [1, 1, 1, 1, 1]),
    ("b", "scored", 0.5, [1, 1]),
    ("a", "scored", 0.0, [1, 1, 0, 0, 1]),  # a tool turn (mask 0) between two sampled runs
    ("a", "scored", 1.0, [1]),
    ("c", "failed", None, [1]),
    ("b", "scored", 0.25, [1, 1, 1, 1]),
    ("b", "scored", 1.0, [0, 0]),  # scored, but nothing of it was sampled
    ("d", "scored", 1.0, [1, 1]),
    ("d", "scored", 0.0, [1]),
]


async def outputs(tokenizer_path: str) -> list[Any]:
    """Each row's ``AgentLoopOutput`` from ``RolloutdAgentLoop.run`` on its canned session."""
    import hydra
    from bridges import FakeClient, canned_trace  # this script's folder is first on sys.path
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import (
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from rolloutd.trainer_client.bridges.verl import AGENT_NAME, RolloutdAgentLoop
    from rolloutd.types import FailureCause, SessionStatus

    failed = FailureCause(kind="backend", message="502 from the engine")
    groups = {}
    for number, (_, session, reward, mask) in enumerate(ROWS):
        trace = canned_trace([7, 8], [100 + number] * len(mask), mask)
        groups[f"row {number}"] = [
            (SessionStatus.COMPLETED, reward, None, trace)
            if session == "scored"
            else (SessionStatus.FAILED, None, failed, trace)
        ]
    RolloutdAgentLoop.configure(FakeClient(groups), task_prefix="adv")
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"prompt_length": 64, "response_length": 64}},
            "data": {"apply_chat_template_kwargs": {}},
        }
    )
    loop = hydra.utils.instantiate(
        config=_agent_loop_registry[AGENT_NAME],
        trainer_config=DictConfigWrap(config=config),
        server_manager=None,
        tokenizer=AutoTokenizer.from_pretrained(tokenizer_path),
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )
    task = {"harness": {"type": "shell", "command": "true"}}
    return [
        await loop.run(
            {"temperature": 1.0},
            raw_prompt=[{"role": "user", "content": f"row {number}"}],
            extra_info={"rolloutd_task": task},
        )
        for number in range(len(ROWS))
    ]


def batch(made: list[Any], rows: list[int]) -> Any:
    """verl's ``DataProto`` of the chosen rows: each output's own ``as_dict`` tensors,
    right-padded to the longest response; ``uid`` the row's group."""
    from verl.protocol import DataProto

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


def advantages(made: list[Any], rows: list[int], estimator: str, norm: bool) -> dict[str, Any]:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.ray_trainer import compute_advantage

    data = compute_advantage(
        batch(made, rows),
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


def union_with_own_uid(made: list[Any], own: bool) -> str:
    """The legacy trainer's path for a left-out row with a ``uid`` of its own in
    ``extra_fields``: ``AgentLoopWorker._postprocess`` (which lays extra fields over the
    prompt's non-tensor columns) then ``batch.union`` with the trainer's repeated batch."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, _InternalAgentLoopOutput
    from verl.protocol import DataProto

    width = max(len(output.response_ids) for output in made)
    uids = np.array([row[0] for row in ROWS], dtype=object)
    internal = []
    for number, output in enumerate(made):
        pad = width - len(output.response_ids)
        response_mask = torch.tensor([output.response_mask + [0] * pad])
        attention = torch.tensor([[1, 1] + [1] * len(output.response_ids) + [0] * pad])
        left_out = "rolloutd_failure" in output.extra_fields
        uid = f"own-{number}" if own and left_out else str(uids[number])
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


def main(tokenizer_path: str) -> None:
    import verl  # noqa: F401 - imports the bridge through VERL_USE_EXTERNAL_MODULES
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    registered = {
        "estimator": "rolloutd_grpo" in ADV_ESTIMATOR_REGISTRY,
        "agent_loop": "rolloutd" in _agent_loop_registry,
    }
    made = asyncio.run(outputs(tokenizer_path))
    reasons = [output.extra_fields.get("rolloutd_failure") for output in made]
    every = list(range(len(ROWS)))
    kept = [i for i in every if reasons[i] is None]
    cases = {}
    for norm in (True, False):
        cases[f"norm={norm}"] = {
            "grpo_without": advantages(made, kept, "grpo", norm),
            "grpo_with": advantages(made, every, "grpo", norm),
            "rolloutd_without": advantages(made, kept, "rolloutd_grpo", norm),
            "rolloutd_with": advantages(made, every, "rolloutd_grpo", norm),
        }
    print(
        json.dumps(
            {
                "registered": registered,
                "rows": [[row[0], reason] for row, reason in zip(ROWS, reasons, strict=True)],
                "response_masks": [output.response_mask for output in made],
                "cases": cases,
                "union": {
                    "prompt_uid": union_with_own_uid(made, False),
                    "own_uid": union_with_own_uid(made, True),
                },
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1])
