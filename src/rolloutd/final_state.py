"""A session's final state, as stored for ``rolloutd reverify``: what its evaluator needs to
score it again without sampling (the records; storing and restoring them is
:mod:`rolloutd.sandbox.final_state`'s).

Stored only when the task asks (``TaskRequest.store_final_state``, a task set's
``store_final_state``), bounded in bytes, under the session's folder of the blob store
(:func:`rolloutd.store.final_state_key`), with the digest of the image the runtime ran.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rolloutd.payload import Payload
from rolloutd.task_spec import EvaluatorSpec, RuntimeSpec

#: the manifest's format, raised when what a reader must know changes
FINAL_STATE_FORMAT = 1


class FinalStateParts(Payload):
    """What of a session's final state its evaluator needs to score it again.

    ``workdir``: the whole workspace and, on a container runtime, what the container changed
    in its own file system outside its mounts (the evaluator's default); ``files``: the
    workspace files ``files`` names only (an answer file); ``patch``: the session's git patch
    (the ``patch`` artifact, already stored: an evaluator that grades in a fresh runtime,
    ``EvaluatorSpec.runtime = "fresh"``, sees nothing else of the session).
    """

    kind: Literal["workdir", "files", "patch"] = Field(
        default="workdir", description="which part (see the class docstring)"
    )
    files: list[str] = Field(
        default_factory=list, description="``files``: workspace-relative paths of the files kept"
    )


class StoredPart(Payload):
    """One stored tar of a final state."""

    key: str = Field(description="its blob-store key")
    num_bytes: int = Field(ge=0, description="its size, bytes")
    num_entries: int = Field(default=0, ge=0, description="files, folders and links in it")


class SystemChanges(Payload):
    """What a container runtime changed in its own file system outside its mounts
    (podman-diff(1), the runtime's mounts left out), with what it wrote."""

    added: list[str] = Field(default_factory=list, description="absolute paths added")
    modified: list[str] = Field(default_factory=list, description="absolute paths modified")
    deleted: list[str] = Field(default_factory=list, description="absolute paths deleted")
    pack: StoredPart | None = Field(
        default=None,
        description="the added and modified entries, owners as the container sees them "
        "(None: nothing written)",
    )
    num_skipped: int = Field(
        default=0,
        ge=0,
        description="written entries not packed: device nodes, FIFOs, hard links to a file "
        "that did not change",
    )


class FinalState(Payload):
    """The manifest of one session's stored final state
    (``sessions/{session_id}/final_state/manifest.json``).

    When ``refused`` or ``error`` is set nothing but the manifest was stored, and the session
    cannot be scored again.
    """

    format: int = Field(default=FINAL_STATE_FORMAT, description="the manifest's format")
    session_id: str = Field(description="the session (its attempt's gateway session id)")
    parts: FinalStateParts = Field(
        default_factory=FinalStateParts, description="what was kept, the evaluator's choice"
    )
    runtime: RuntimeSpec = Field(
        description="the spec of the runtime a re-score restores the state into (the session's, "
        "or the evaluator's fresh runtime's for ``patch``)"
    )
    evaluator: EvaluatorSpec = Field(description="the session's evaluator spec")
    image_digest: str | None = Field(
        default=None,
        description="the id (sha256) of the image the session's runtime ran, container "
        "runtimes; None elsewhere",
    )
    workdir: StoredPart | None = Field(
        default=None, description="``workdir`` and ``files``: the workspace's tar"
    )
    missing_files: list[str] = Field(
        default_factory=list,
        description="``files``: named files that were not there (or not regular files)",
    )
    num_skipped: int = Field(
        default=0, ge=0, description="workspace entries not kept: FIFOs, sockets, devices"
    )
    patch_key: str | None = Field(
        default=None, description="``patch``: the ``patch`` artifact's key (None: no patch)"
    )
    system: SystemChanges | None = Field(
        default=None, description="``workdir`` on a container runtime: its system changes"
    )
    num_bytes: int = Field(default=0, ge=0, description="bytes stored over all parts")
    max_bytes: int = Field(ge=1, description="the bound it was stored under, bytes")
    refused: str | None = Field(
        default=None, description="why nothing was stored: the state passed ``max_bytes``"
    )
    error: str | None = Field(default=None, description="why storing it failed")
    stored_at: float | None = Field(default=None, description="Unix time, s")

    @property
    def stored(self) -> bool:
        """Whether the state was stored (it can be restored)."""
        return self.refused is None and self.error is None
