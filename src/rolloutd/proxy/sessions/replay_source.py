"""Replay across attempts: a new attempt of a sample answers each request identical to one an
earlier attempt recorded from that record, instead of sampling it again (see
docs/sessions.md, "Replay across attempts").

The source of a session is the sealed logs of the sample's earlier attempts, newest first
(``SessionState.replay_from``). Each earlier completion is offered once: one that a later
attempt replayed already is offered as that attempt's copy (which names it in
``replayed_from``), so attempt 3 replays attempt 2's log plus what attempt 2 had not consumed of
attempt 1's.

The replay key is the request identity of docs/sessions.md ("Request identity"):
:func:`rolloutd.proxy.core.request_identity.request_hash`, the canonical body including
``stream``, minus the dialect's :data:`rolloutd.proxy.core.request_identity.VOLATILE_FIELDS`
(never messages, tools or sampling). A request that matches no source completion not yet replayed is
sampled as usual, so each conversation replays until its first difference, whatever order its
sub-agents' calls come in.

A replayed completion is a copy of its source: the same tokens, logprobs, policy version,
answer and answer ids (harnesses echo response, item and tool-call ids back; new ones would end
replay at the next turn), with the new session's id, the next index of its log, ``extends``
remapped to the new log and ``replayed_from`` naming the source. What was replayed is read
back from ``replayed_from`` when a gateway loads the session again (a restart), so the
position survives it.

The source logs are read on the session's first call (or at its close), not when it opens:
an attempt that never calls reads nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import structlog

from rolloutd.routes import completion_routes
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.types import Completion, ReplayEnd, ReplayStats

log = structlog.get_logger(__name__)


def completion_key(completion: Completion) -> str:
    """``{session_id}#{index}``: how ``replayed_from`` names a completion."""
    return f"{completion.session_id}#{completion.index}"


def replayed_copy(
    source: Completion,
    *,
    session_id: str,
    index: int,
    extends: int | None,
    request: dict[str, object],
    body_hash: str,
    response_id: str,
) -> Completion:
    """The completion that replays ``source`` as completion ``index`` of session
    ``session_id`` (pure): ``source``'s tokens, logprobs, policy version, timings, answer and
    answer id; this call's raw request (its volatile fields may differ) and identity.

    Args:
        source: the earlier attempt's completion.
        session_id: the new attempt's session.
        index: its index in the new log.
        extends: ``source.extends`` remapped to the new log (None: a fresh render there).
        request: the raw request body of this call.
        body_hash: this call's request identity (equal to ``source.request_hash``).
        response_id: the id the harness got with ``source``'s answer
            (:func:`rolloutd.proxy.sessions.recorder.answer_id`).
    """
    return source.model_copy(
        update={
            "session_id": session_id,
            "index": index,
            "extends": extends,
            "replayed_from": completion_key(source),
            "response_id": response_id,
            "request": request,
            "request_hash": body_hash,
            # its own copy of the source's rows is written when it is recorded
            "routed_experts": None,
            # no engine was called: nothing was sent, nothing came from a cache
            "num_prompt_tokens": None,
            "num_cached_tokens": None,
        }
    )


class ReplaySource:
    """The earlier attempts' completions a session may replay, indexed by replay key.

    Use under one session's calls: :meth:`take` is synchronous, so concurrent calls never take
    the same source completion.

    Args:
        store: the blob store holding the source logs.
        source_ids: gateway session ids of the earlier attempts, newest first; an id without
            a log (a session that never opened) offers nothing.
        max_staleness: policy versions a source completion may lag behind the backend's
            current one (``TaskRequest.replay_max_staleness``).
    """

    def __init__(self, store: BlobStore, source_ids: Sequence[str], max_staleness: int = 0) -> None:
        self.store = store
        self.source_ids = list(source_ids)
        self.max_staleness = max_staleness
        self.loaded = False
        self._lock = asyncio.Lock()
        #: source completions offered for replay, in source order (newest attempt first)
        self.offered: list[Completion] = []
        self._by_hash: dict[str, list[Completion]] = {}
        #: every completion of the source logs by key (successor lookups, extends remapping)
        self._all: dict[str, Completion] = {}
        #: a source completion's key -> the key of the newer attempt's copy that replayed it
        self._newer: dict[str, str] = {}
        #: source key -> index in the new log of the completion that replayed it
        self.taken: dict[str, int] = {}
        #: source keys passed over for their policy version
        self.stale: set[str] = set()

    def source_routes(self, source: Completion) -> Any:
        """The routed experts of source completion ``source`` from position 0
        (:func:`rolloutd.routes.completion_routes` over its own log), for its copy: a replayed
        completion carries the rows that sampled it, as it carries its tokens."""
        return completion_routes(
            self.store,
            source,
            lambda index: self._all[f"{source.session_id}#{index}"],
        )

    async def ensure_loaded(self, completions: Sequence[Completion]) -> None:
        """Read and index the source logs once (in a worker thread), and mark as taken the
        source completions that ``completions`` (the session's own log, as loaded after a
        gateway restart) replayed already."""
        if self.loaded:
            return
        async with self._lock:
            if self.loaded:
                return
            logs = await asyncio.to_thread(self._read)
            self._index(logs)
            for completion in completions:
                if completion.replayed_from:
                    self.taken[completion.replayed_from] = completion.index
            self.loaded = True
        log.info(
            "replay_source_loaded",
            sources=self.source_ids,
            num_offered=len(self.offered),
            num_replayed_before=len(self.taken),
        )

    def _read(self) -> list[list[Completion]]:
        # a source that never opened has no log: it offers nothing
        return [CompletionLog(self.store, source_id).read_all() for source_id in self.source_ids]

    def _index(self, logs: list[list[Completion]]) -> None:
        consumed: set[str] = set()
        for completions in logs:
            for completion in completions:
                self._all[completion_key(completion)] = completion
                if completion.replayed_from:
                    consumed.add(completion.replayed_from)
                    self._newer[completion.replayed_from] = completion_key(completion)
        for completions in logs:
            for completion in completions:
                if completion_key(completion) not in consumed:
                    self.offered.append(completion)
                    self._by_hash.setdefault(completion.request_hash, []).append(completion)

    def take(self, body_hash: str, policy_version: int) -> Completion | None:
        """The first source completion of replay key ``body_hash`` not replayed yet and not
        staler than allowed, marked as taken (:meth:`placed` gives its new index, or
        :meth:`release` hands it back when recording failed); None when there is none.

        Args:
            body_hash: the request's identity
                (:func:`rolloutd.proxy.core.request_identity.request_hash`).
            policy_version: the current policy version of the session's backend.
        """
        for completion in self._by_hash.get(body_hash, ()):
            key = completion_key(completion)
            if key in self.taken:
                continue
            if policy_version - completion.policy_version > self.max_staleness:
                self.stale.add(key)
                continue
            self.taken[key] = -1
            return completion
        return None

    def placed(self, source: Completion, index: int) -> None:
        """``source`` is replayed as completion ``index`` of the new log."""
        self.taken[completion_key(source)] = index

    def release(self, source: Completion) -> None:
        """Recording the copy of ``source`` failed: offer it again."""
        self.taken.pop(completion_key(source), None)

    def remap(self, source: Completion) -> int | None:
        """``source.extends`` as an index of the new log: the completion that replayed the one
        ``source`` continues (or a newer attempt's copy of it); None when none did."""
        if source.extends is None:
            return None
        key = f"{source.session_id}#{source.extends}"
        seen = 0
        while key not in self.taken and key in self._newer and seen < 64:
            key, seen = self._newer[key], seen + 1
        index = self.taken.get(key, -1)
        return index if index >= 0 else None

    def _successor(self, source: Completion) -> Completion | None:
        """The first completion of ``source``'s own log that continues its conversation."""
        for completion in self._all.values():
            if (
                completion.session_id == source.session_id
                and completion.index > source.index
                and _continues(completion, source)
            ):
                return completion
        return None

    def stats(self, completions: Sequence[Completion]) -> ReplayStats:
        """What replay did in a session whose log is ``completions`` (call after
        :meth:`ensure_loaded`).

        A conversation's replay ends at a replayed completion that no other replayed
        completion of the log continues: ``body_differed`` when its source went on (the next
        request differed, or its next completion was too stale), ``source_ended`` when the
        source recorded nothing after it.
        """
        replayed = [c for c in completions if c.replayed_from]
        continued = _continued(replayed)
        ends = []
        for completion in replayed:
            if completion.index in continued:
                continue
            source = self._all.get(completion.replayed_from or "")
            went_on = source is not None and self._successor(source) is not None
            ends.append(
                ReplayEnd(
                    last_index=completion.index,
                    source=completion.replayed_from or "",
                    reason="body_differed" if went_on else "source_ended",
                )
            )
        offered = {completion_key(c) for c in self.offered}
        return ReplayStats(
            sources=self.source_ids,
            num_source_completions=len(self.offered),
            num_replayed=len(replayed),
            num_not_replayed=len(offered - {c.replayed_from for c in replayed}),
            num_stale=len(self.stale - {c.replayed_from for c in replayed}),
            num_prompt_tokens_saved=sum(len(c.prompt_ids) for c in replayed),
            num_response_tokens_saved=sum(len(c.response_ids) for c in replayed),
            ends=ends,
        )


def _answer_key(message: dict[str, Any]) -> tuple[Any, ...] | None:
    """What :func:`_same_answer` compares of an assistant message: its content and its tool
    calls' ids (None: not an assistant message)."""
    if message.get("role") != "assistant":
        return None
    calls = tuple(c.get("id") for c in message.get("tool_calls") or [])
    return (message.get("content") or "", calls)


def _continued(replayed: Sequence[Completion]) -> set[int]:
    """The indices of the completions of ``replayed`` (one log, in index order) that a later
    one of them continues (:func:`_continues`), in one pass: by ``extends``, else by looking
    up, at each assistant message of a later completion's messages, the earlier completions
    with that many messages and that answer, each compared until it is found continued.
    The work is linear in the messages read, where comparing every pair was quadratic in the
    replayed completions."""
    continued: set[int] = set()
    by_index = {c.index: c for c in replayed}
    #: (session, number of messages, answer key) -> replayed completions not found continued
    waiting: dict[tuple[Any, ...], list[Completion]] = {}
    for completion in replayed:
        key = _answer_key(completion.response_message)
        if key is not None:
            slot = (completion.session_id, len(completion.messages), key)
            waiting.setdefault(slot, []).append(completion)
    for later in replayed:
        if later.extends is not None:
            earlier = by_index.get(later.extends)
            if earlier is not None and earlier.session_id == later.session_id:
                continued.add(earlier.index)
            continue
        for n, message in enumerate(later.messages):
            key = _answer_key(message)
            candidates = waiting.get((later.session_id, n, key)) if key is not None else None
            if not candidates:
                continue
            found = [
                e for e in candidates if e.index < later.index and later.messages[:n] == e.messages
            ]
            for earlier in found:
                continued.add(earlier.index)
                candidates.remove(earlier)
    return continued


def _continues(later: Completion, earlier: Completion) -> bool:
    """Whether ``later`` continues ``earlier``'s conversation in the same log: by ``extends``
    (tokens mode), else (``passthrough``, or a fresh render) by its messages starting with
    ``earlier``'s messages and answer."""
    if later.session_id != earlier.session_id:
        return False
    if later.extends is not None:
        return later.extends == earlier.index
    n = len(earlier.messages)
    return (
        len(later.messages) > n
        and later.messages[:n] == earlier.messages
        and _same_answer(later.messages[n], earlier.response_message)
    )


def _same_answer(message: dict[str, object], answer: dict[str, object]) -> bool:
    """The harness sent ``answer`` back as ``message`` (role, content and tool calls; the
    harness may reshape the rest)."""
    if message.get("role") != "assistant":
        return False
    calls = [c.get("id") for c in message.get("tool_calls") or []]  # type: ignore[union-attr]
    answer_calls = [c.get("id") for c in answer.get("tool_calls") or []]  # type: ignore[union-attr]
    return calls == answer_calls and (message.get("content") or "") == (answer.get("content") or "")
