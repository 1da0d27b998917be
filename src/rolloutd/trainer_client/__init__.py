"""The trainer side: connect over Temporal's gRPC client, submit, await, cancel, read traces;
the durable buffer (take / ack); backend-pool admin; a blocking wrapper; export batches to
verl / slime / SFT JSONL / Parquet; GRPO and DAPO helpers."""

from rolloutd.errors import FleetUnavailableError
from rolloutd.scoring import failure_of, scored_sessions
from rolloutd.trainer_client.admin import AdminError, BackendAdmin
from rolloutd.trainer_client.buffer import BufferExhaustedError, RolloutBuffer
from rolloutd.trainer_client.client import (
    InvalidTaskError,
    RolloutClient,
    RolloutHandle,
    validate_task,
)
from rolloutd.trainer_client.exports import (
    failed_cause,
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
from rolloutd.trainer_client.health import FleetHealth
from rolloutd.trainer_client.rest_client import RestClient, RestError
from rolloutd.trainer_client.sync import SyncRolloutBuffer, SyncRolloutClient

__all__ = [
    "AdminError",
    "BackendAdmin",
    "BufferExhaustedError",
    "FleetHealth",
    "FleetUnavailableError",
    "InvalidTaskError",
    "RolloutBuffer",
    "RolloutClient",
    "RolloutHandle",
    "RestClient",
    "RestError",
    "SyncRolloutBuffer",
    "SyncRolloutClient",
    "dapo_filter",
    "failed_cause",
    "failure_of",
    "group_advantages",
    "group_rewards",
    "is_zero_variance",
    "parquet_schema",
    "scored_sessions",
    "to_openai_messages_jsonl",
    "to_parquet",
    "to_slime_samples",
    "to_verl_batch",
    "trace_reward",
    "trace_weights",
    "validate_task",
]
