"""The trainer side: connect over Temporal's gRPC client, submit, await, cancel, read traces;
export batches to verl / slime / SFT JSONL / Parquet; GRPO and DAPO helpers."""

from rolloutd.trainer_client.client import (
    InvalidTaskError,
    RolloutClient,
    RolloutHandle,
    validate_task,
)
from rolloutd.trainer_client.exports import (
    parquet_schema,
    to_openai_messages_jsonl,
    to_parquet,
    to_slime_samples,
    to_verl_batch,
    trace_reward,
)
from rolloutd.trainer_client.grpo import (
    dapo_filter,
    group_advantages,
    group_rewards,
    is_zero_variance,
    trace_weights,
)

__all__ = [
    "InvalidTaskError",
    "RolloutClient",
    "RolloutHandle",
    "dapo_filter",
    "group_advantages",
    "group_rewards",
    "is_zero_variance",
    "parquet_schema",
    "to_openai_messages_jsonl",
    "to_parquet",
    "to_slime_samples",
    "to_verl_batch",
    "trace_reward",
    "trace_weights",
    "validate_task",
]
