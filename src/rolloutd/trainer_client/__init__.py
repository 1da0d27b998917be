"""The trainer's client of rolloutd: connect over Temporal's gRPC client, submit, await,
cancel, read traces; the durable buffer (take / ack); backend-pool admin; a blocking wrapper;
the REST facade's client; the fleets' health while a caller waits.

What trains on the results (exports to verl / slime / SFT JSONL / Parquet, GRPO and DAPO
helpers, weight sync, the GGUF export, the probe) is :mod:`rolloutd.trainer_client.training`;
the trainer bridges are :mod:`rolloutd.trainer_client.bridges`. Nothing here imports either
(an import contract keeps it so), so a process that only submits and reads stays light.
"""

from rolloutd.errors import FleetUnavailableError
from rolloutd.trainer_client.admin import AdminError, BackendAdmin
from rolloutd.trainer_client.buffer import BufferExhaustedError, RolloutBuffer
from rolloutd.trainer_client.client import (
    InvalidTaskError,
    RolloutClient,
    RolloutHandle,
    validate_task,
)
from rolloutd.trainer_client.health import FleetHealth
from rolloutd.trainer_client.rest_client import RestClient, RestError
from rolloutd.trainer_client.sync_client import SyncRolloutBuffer, SyncRolloutClient

__all__ = [
    "AdminError",
    "BackendAdmin",
    "BufferExhaustedError",
    "FleetHealth",
    "FleetUnavailableError",
    "InvalidTaskError",
    "RestClient",
    "RestError",
    "RolloutBuffer",
    "RolloutClient",
    "RolloutHandle",
    "SyncRolloutBuffer",
    "SyncRolloutClient",
    "validate_task",
]
