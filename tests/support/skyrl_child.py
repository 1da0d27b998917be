"""The trainer side of the SkyRL bridge test, run by skyrl's own environment's Python 3.12
(scripts/setup_trainers.sh): SkyRL 0.4.0's ``GeneratorInput`` in, ``RolloutdGenerator.
generate``, then SkyRL's own ``validate_generator_output`` on the answer.

Prints one JSON line: the output (trajectory ids as dicts) and whether SkyRL accepted it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any


def generator_input(tasks: dict[str, tuple[str, dict[str, Any], int]]) -> Any:
    """SkyRL's ``GeneratorInput`` of a training step: instance id -> (instruction, rolloutd
    task fields, repetitions), each repeated as SkyRL's trainer repeats a prompt."""
    from skyrl.train.generators.base import BatchMetadata, GeneratorInput, TrajectoryID

    from rolloutd.trainer_client.bridges.skyrl import TASK_EXTRA

    prompts, extras, ids = [], [], []
    for instance, (instruction, fields, n) in tasks.items():
        for repetition in range(n):
            prompts.append([{"role": "user", "content": instruction}])
            extras.append({TASK_EXTRA: fields})
            ids.append(TrajectoryID(instance_id=instance, repetition_id=repetition))
    return GeneratorInput(
        prompts=prompts,
        env_classes=["rolloutd"] * len(prompts),
        env_extras=extras,
        sampling_params=None,
        trajectory_ids=ids,
        batch_metadata=BatchMetadata(global_step=0, training_phase="train"),
    )


async def main(args: argparse.Namespace) -> None:
    from skyrl.train.utils.trainer_utils import validate_generator_output

    from rolloutd.trainer_client import RolloutClient
    from rolloutd.trainer_client.bridges.skyrl import RolloutdGenerator

    tasks = json.loads(args.tasks)  # instance id -> [instruction, task fields]
    batch = generator_input({k: (i, fields, args.n) for k, (i, fields) in tasks.items()})
    client = await RolloutClient.connect(args.temporal, store_url=args.store)
    generator = RolloutdGenerator(client, task_prefix=args.task_prefix, eos_token_id=args.eos)
    output = await generator.generate(batch)
    validate_generator_output(len(batch["prompts"]), output)  # raises when SkyRL refuses it
    print(
        json.dumps(
            {
                "validated": True,
                "output": {
                    **{k: v for k, v in output.items() if k != "trajectory_ids"},
                    "trajectory_ids": [
                        [t.instance_id, t.repetition_id] for t in output["trajectory_ids"]
                    ],
                },
                "stats": generator.stats.as_dict(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--temporal", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--tasks", required=True, help="JSON: instance id -> [instruction, task]")
    parser.add_argument("--n", type=int, default=2, help="samples per prompt")
    parser.add_argument("--eos", type=int, required=True)
    parser.add_argument("--task-prefix", default="skyrl")
    asyncio.run(main(parser.parse_args()))
