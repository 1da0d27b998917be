"""What the gateway persists about a session, and its keys in the blob store.

Blob-store keys (besides :mod:`rolloutd.store`'s completion log)::

    sessions/{session_id}/session.json          SessionState (the key's sha256, never the key)
    gateway/session_keys/{sha256(key)}.json     {"session_id": ...}: key -> session id

The gateway only verifies keys, so it keeps their hashes: neither the store nor a listing
holds a usable key.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rolloutd.payload import Payload
from rolloutd.proxy.sessions.call_errors import CallError, RecoveryIndex
from rolloutd.store import session_prefix
from rolloutd.types import CaptureMode, Completion, SamplingParams


def session_state_key(session_id: str) -> str:
    """Blob-store key of a session's gateway state."""
    return f"{session_prefix(session_id)}/session.json"


def hash_session_key(session_key: str) -> str:
    """The sha256 of a session key, hex: what the gateway stores and compares."""
    return hashlib.sha256(session_key.encode()).hexdigest()


def session_key_index(session_key: str) -> str:
    """Blob-store key mapping a session key (by its sha256) to its session id."""
    return f"gateway/session_keys/{hash_session_key(session_key)}.json"


class BackendMove(Payload):
    """A session moved off a removed backend (its token chain stays valid: prompts are ids)."""

    moved_from: str = Field(description="the removed backend")
    moved_to: str = Field(description="the live backend that took the session")
    at_index: int = Field(description="index of the first completion sampled on ``moved_to``")
    at: float = Field(description="Unix time (s) of the move")


def unrecovered_errors(
    state: SessionState, completions: list[Completion] | RecoveryIndex
) -> list[CallError]:
    """Every failed call that no later completion made good
    (:meth:`RecoveryIndex.recovered`), oldest first: ``state.open_errors`` (all of them, one
    per distinct request), or for a state written before that list existed, the last
    :data:`MAX_RECORDED_ERRORS` failed calls.

    Args:
        state: the session's state.
        completions: its completion log, or the session's :class:`RecoveryIndex` over it
            (what a session in gateway memory passes: nothing is hashed twice).
    """
    recovery = completions if isinstance(completions, RecoveryIndex) else RecoveryIndex(completions)
    candidates = state.errors if state.open_errors is None else state.open_errors
    return [error for error in candidates if not recovery.recovered(error)]


class PrefixCacheUsage(Payload):
    """A session's prompt tokens and what its backends served from their prefix caches,
    over its completions sampled by a backend that reports cached tokens."""

    num_completions: int = Field(default=0, ge=0, description="completions counted")
    num_prompt_tokens: int = Field(default=0, ge=0, description="their prompt tokens")
    num_cached_tokens: int = Field(
        default=0, ge=0, description="of those, served from the backend's prefix cache"
    )

    @property
    def hit_rate(self) -> float | None:
        """``num_cached_tokens / num_prompt_tokens``, or None with no prompt token."""
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else None


def prefix_cache_usage(completions: list[Completion]) -> PrefixCacheUsage:
    """The prefix-cache figures of ``completions`` (those whose ``num_cached_tokens`` the
    backend reported; replayed ones called no engine and are not counted)."""
    counted = [c for c in completions if c.num_cached_tokens is not None]
    return PrefixCacheUsage(
        num_completions=len(counted),
        num_prompt_tokens=sum(c.num_prompt_tokens or 0 for c in counted),
        num_cached_tokens=sum(c.num_cached_tokens or 0 for c in counted),
    )


class SessionState(Payload):
    """What the gateway persists about a session."""

    model_config = ConfigDict(extra="allow")

    session_id: str = Field(description="``{task_id}/{sample_index}``")
    task_id: str
    session_key_sha256: str = Field(
        description="the sha256 (hex) of the secret (``secrets.token_urlsafe(24)``); a state "
        "written with the key in clear is read as its hash"
    )
    sampling: SamplingParams = Field(
        default_factory=SamplingParams, description="the task's sampling parameters"
    )
    model: str = Field(description="the model name shown to the harness")
    capture_mode: CaptureMode = CaptureMode.TOKENS
    backend: str = Field(description="name of the pinned backend")
    pool: Literal["policy", "judge"] = Field(
        default="policy",
        description="the backend pool serving it: ``judge`` for a judge session (its "
        "completions are recorded with ``trainable`` false)",
    )
    created_at: float = 0.0
    closed: bool = Field(default=False, description="sealed: no further call is accepted")
    closed_at: float | None = None
    num_completions: int = Field(default=0, description="completions in the log when it was sealed")
    prefix_cache: PrefixCacheUsage | None = Field(
        default=None,
        description="prompt and cached tokens of its completions when it was sealed "
        "(:func:`prefix_cache_usage`); None before it is sealed",
    )
    backend_moves: list[BackendMove] = Field(
        default_factory=list, description="the moves off removed backends, in order"
    )
    num_errors: int = Field(
        default=0,
        ge=0,
        description="calls that failed (answered with an error, nothing recorded in the log)",
    )
    errors: list[CallError] = Field(
        default_factory=list, description="the most recent :data:`MAX_RECORDED_ERRORS` of them"
    )
    open_errors: list[CallError] | None = Field(
        default=None,
        description="every failed call no completion has made good yet (:func:`still_open`), "
        "however many; None in a state written before it was kept",
    )
    replay_from: list[str] = Field(
        default_factory=list,
        description="gateway session ids of the sample's earlier attempts, newest first, whose "
        "logs answer requests identical to theirs "
        "(:mod:`rolloutd.proxy.sessions.replay_source`)",
    )
    replay_max_staleness: int = Field(
        default=0, ge=0, description="policy versions a replayed completion may lag behind"
    )

    @model_validator(mode="before")
    @classmethod
    def _hash_a_clear_key(cls, data: Any) -> Any:
        # a state written before keys were hashed: keep only the hash, in memory and on the
        # next write
        if isinstance(data, dict) and "session_key" in data:
            data = dict(data)
            key = data.pop("session_key")
            data.setdefault("session_key_sha256", hash_session_key(key))
        return data


class SessionInfo(BaseModel):
    """What opening a session returns: everything a harness adapter needs.

    Attributes:
        openai_base_url: ``{public_url}/s/{key}/v1`` (OpenAI chat/responses clients).
        anthropic_base_url: ``{public_url}/s/{key}`` (Anthropic clients append ``/v1``).
        gemini_base_url: ``{public_url}/s/{key}`` (Gemini clients append ``/v1beta``).
    """

    model_config = ConfigDict(extra="allow")

    session_id: str
    session_key: str
    openai_base_url: str
    anthropic_base_url: str
    gemini_base_url: str
    model: str
    backend: str
