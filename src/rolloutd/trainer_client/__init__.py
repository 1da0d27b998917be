"""The trainer side: connect over Temporal's gRPC client, submit, await, cancel, read traces."""

from rolloutd.trainer_client.client import (
    InvalidTaskError,
    RolloutClient,
    RolloutHandle,
    validate_task,
)

__all__ = ["InvalidTaskError", "RolloutClient", "RolloutHandle", "validate_task"]
