"""SkyRL 0.4.0's own advantage computation over the SkyRL bridge's answer, run by skyrl's own
environment's Python 3.12 (scripts/setup_trainers.sh).

What is SkyRL's: ``GeneratorInput``/``TrajectoryID``, ``validate_generator_output``,
``convert_prompts_responses_to_batch_tensors`` (its trainer's padding of a
``GeneratorOutput``) and ``compute_advantages_and_returns`` through its estimator registry
(``grpo``, grouped by ``instance_id`` as its trainer groups). The rolloutd side is the
stand-in client of ``tests/support/bridges.py`` (canned groups, rolloutd's own types): one
group whole, one with a session that failed for the infrastructure. Each row's scalar reward
goes on its last response token, as SkyRL's trainer puts it (``postprocess_generator_output``).

Prints one JSON line: each row's instance, reward and loss-mask sum, and the per-row advantage
(on the last response token) of the whole batch and of the whole group alone.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np

#: instance -> one (reward or None for a failed session, response ids, loss mask) per sample
GROUPS: dict[str, list[tuple[float | None, list[int], list[int]]]] = {
    "whole": [
        (1.0, [10, 11, 20, 12, 2], [1, 1, 0, 1, 1]),
        (0.0, [13, 2], [1, 1]),
        (0.5, [14, 15, 2], [1, 1, 1]),
        (0.0, [16, 2], [1, 1]),
    ],
    "broken": [
        (1.0, [30, 2], [1, 1]),
        (None, [31], [1]),
        (0.0, [32, 2], [1, 1]),
        (1.0, [33, 2], [1, 1]),
    ],
}


def canned() -> Any:
    # this script's folder is first on sys.path: tests/support/bridges.py
    from bridges import FakeClient, canned_trace

    from rolloutd.types import FailureCause, SessionStatus

    failed = FailureCause(kind="backend", message="502 from the engine")
    return FakeClient(
        {
            instance: [
                (SessionStatus.COMPLETED, reward, None, canned_trace([5, 6], ids, mask))
                if reward is not None
                else (SessionStatus.FAILED, None, failed, canned_trace([5, 6], ids, mask))
                for reward, ids, mask in samples
            ]
            for instance, samples in GROUPS.items()
        }
    )


def advantages(output: dict[str, Any], uids: list[str], rows: list[int]) -> list[float]:
    """SkyRL's GRPO advantage of each chosen row, on its last response token."""
    from skyrl.backends.skyrl_train.utils import ppo_utils
    from skyrl.train.config import AlgorithmConfig
    from skyrl.train.dataset.preprocess import convert_prompts_responses_to_batch_tensors

    responses = [output["response_ids"][r] for r in rows]
    rewards = [[0.0] * (len(ids) - 1) + [output["rewards"][r]] for r, ids in zip(rows, responses)]
    _, _, response_mask, token_rewards, _, _, _, _ = convert_prompts_responses_to_batch_tensors(
        0,
        [output["prompt_token_ids"][r] for r in rows],
        responses,
        rewards,
        [output["loss_masks"][r] for r in rows],
    )
    adv, _ = ppo_utils.compute_advantages_and_returns(
        token_level_rewards=token_rewards,
        response_mask=response_mask,
        index=np.array([uids[r] for r in rows]),
        adv_estimator="grpo",
        config=AlgorithmConfig(),
        values=None,
        grpo_norm_by_std=True,
    )
    return adv[:, -1].tolist()  # responses are right-aligned: the last column is a response's


async def main() -> None:
    # skyrl_child.py: this script's folder is first on sys.path
    from skyrl.train.utils.trainer_utils import validate_generator_output
    from skyrl_child import generator_input

    from rolloutd.trainer_client.bridges.skyrl import RolloutdGenerator

    fields = {"harness": {"type": "shell", "command": "true"}}
    batch = generator_input({k: (k, fields, len(samples)) for k, samples in GROUPS.items()})
    generator = RolloutdGenerator(canned(), task_prefix="skyrl-adv", eos_token_id=2)
    output = await generator.generate(batch)
    validate_generator_output(len(batch["prompts"]), output)
    uids = [t.instance_id for t in output["trajectory_ids"]]
    every = list(range(len(uids)))
    whole = [r for r in every if uids[r] == "whole"]
    print(
        json.dumps(
            {
                "rows": [
                    [uid, reward, sum(mask)]
                    for uid, reward, mask in zip(uids, output["rewards"], output["loss_masks"])
                ],
                "all": advantages(output, uids, every),
                "whole_alone": advantages(output, uids, whole),
                "stats": generator.stats.as_dict(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main())
