"""The one base of rolloutd's models that cross a process boundary: Temporal payloads (every
workflow's, activity's, signal's, update's and query's input and output), the blob store's
records and what the trainer client reads.

Unknown fields are ignored, so old and new workers interoperate while a field is added or
retired (Temporal's advice for payload evolution: docs.temporal.io, "Workflow and activity
input evolution"); every new field gets a default for the same reason. A field is documented
in one way only: ``Field(description=...)``, which the JSON schema and the generated docs read.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Payload(BaseModel):
    """Base of every model that crosses a process boundary: unknown fields are ignored,
    fields may be given by name or alias."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class StrictInput(BaseModel):
    """Base of models that only read what a person or a trainer wrote (a task set's
    ``task.toml``, a SWE-bench row, the trainer's task options): unknown fields are refused,
    so a typo is named by its field instead of being silently dropped."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
