"""Per-session memo of the work a call repeats for the conversation it resends.

The rule it keeps: a call's cost must not grow with the conversation.

A harness resends the whole conversation on every call and adds a message or two, so a call's
dialect translation and its retry hash would grow with the conversation. A
:class:`RequestMemo`, one per session, keeps what the last call of each of the session's
recent conversations (sub-agents alternate) computed for its messages: their translation and
the sha256 state of the request hash after them. The next call reuses both when its messages
start with exactly those messages, and computes only the new ones.

"Exactly" means the same objects: the gateway reads a session's bodies with its
:class:`~rolloutd.proxy.core.fastjson.BodyReader`, which hands the next body the very objects of
the messages it resends and says so (:meth:`~rolloutd.proxy.core.fastjson.BodyReader.continues`);
other lists are compared object by object (a pointer comparison each). Bodies and
translations are read, never modified, by everything that holds them. Otherwise (another
reader, a gateway restarted, a message the harness changed) it is a type-exact fingerprint of
the raw JSON values (``marshal`` format 2, then blake2b): Python's ``==`` holds for ``1``,
``1.0`` and ``true``, which JSON (and a translation that re-serialises tool call arguments)
tells apart. The fingerprint of a prefix is computed once per request and shared by the
translation and the hash.

Results are identical to the plain functions' (:func:`request_hash`, each dialect's ``parse``);
property tests (tests/proxy/sessions/test_request_identity.py) check that over random
conversation growth, also interleaved. Memory: up to :data:`MAX_CONVERSATIONS` conversations
per session, the same message objects their last completions hold, plus a sha256 state
each.
"""

from __future__ import annotations

import hashlib
import marshal
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rolloutd.errors import RequestFieldError
from rolloutd.proxy.core.fastjson import BodyReader, canonical_json

W = TypeVar("W")

#: the body field that holds the conversation, per dialect's body shape (the first that is a
#: list is the one hashed incrementally)
CONVERSATION_FIELDS = ("messages", "contents", "input")


#: per dialect, the body fields that change per harness process and carry no conversation
#: (dotted paths; ``[client]`` steps into every item of a list that the client built): left
#: out of a
#: request's identity, so a request resent by another process of the same harness (a new
#: attempt, docs/sessions.md "Request identity") has the identity it had. Never messages' text,
#: tools or sampling values. Claude Code puts a per-process id in ``metadata.user_id``. Codex
#: (0.6x, measured by benchmarks/replay_coverage.py) sends a per-process ``prompt_cache_key``,
#: ``client_metadata`` (installation, session, thread and turn ids) and a fresh id on each
#: item it builds (messages ``msg_{uuid}``, tool outputs ``fco_{uuid}``); the ids of items
#: the gateway answered with (function calls, reasoning) are the gateway's, replayed as they
#: were, and kept.
VOLATILE_FIELDS: dict[str, tuple[str, ...]] = {
    "openai_chat": ("prompt_cache_key",),
    "openai_responses": ("prompt_cache_key", "client_metadata", "input.[client].id"),
    "anthropic": ("metadata.user_id",),
    "gemini": (),
}


def _is_client_item(value: Any) -> bool:
    """A Responses input item the client builds: a message (``type: message``, or a role
    without type) or a tool's output (``function_call_output``, ``*_call_output``), never an
    ``item_reference`` (its id is what it says)."""
    if not isinstance(value, dict):
        return False
    kind = value.get("type")
    return (
        kind == "message"
        or (kind is None and "role" in value)
        or (isinstance(kind, str) and kind.endswith("_output"))
    )


def _without(value: Any, path: list[str]) -> Any:
    """``value`` without what ``path`` names (the same object when nothing is removed;
    otherwise copies along the path only)."""
    step, rest = path[0], path[1:]
    if step == "[client]":
        if not isinstance(value, list) or not rest:
            return value
        items = [_without(v, rest) if _is_client_item(v) else v for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if not isinstance(value, dict) or step not in value:
        return value
    if not rest:
        return {k: v for k, v in value.items() if k != step}
    inner = _without(value[step], rest)
    return value if inner is value[step] else {**value, step: inner}


def identity_body(body: Any, dialect: str = "") -> Any:
    """``body`` without the :data:`VOLATILE_FIELDS` of ``dialect`` (the same object when it
    has none of them; otherwise a shallow copy along each removed path: the body is never
    modified, the items of its conversation list that lose nothing are shared).

    Args:
        body: the request body as parsed JSON.
        dialect: ``openai_chat``, ``openai_responses``, ``anthropic``, ``gemini``; another
            name (or ``""``) removes nothing.
    """
    for path in VOLATILE_FIELDS.get(dialect, ()):
        body = _without(body, path.split("."))
    return body


def request_hash(body: dict[str, Any], dialect: str = "") -> str:
    """A request's identity: sha256 (hex) of the canonical JSON (sorted keys, no spaces) of
    its body without the dialect's :data:`VOLATILE_FIELDS`. ``stream`` is part of it.

    Args:
        body: the request body as parsed JSON.
        dialect: the body's dialect (``""``: the whole body).
    """
    return hashlib.sha256(canonical_json(identity_body(body, dialect)).encode()).hexdigest()


def validate_new_items(
    body: dict[str, Any], field: str, known: int, validate: Callable[[dict[str, Any]], W]
) -> tuple[W | None, int]:
    """Validate ``body`` with its list ``body[field]`` cut to the items after the ``known``
    ones a memo already translated (with none new, the last one again, so that a field that
    must not be empty is not).

    Args:
        body: the request body; ``body[field]`` is a list longer than 0.
        field: ``messages``, ``contents`` or ``input``.
        known: items at the start of ``body[field]`` the memo knows (>= 1).
        validate: the dialect's validation of a whole body.

    Returns:
        ``(wire, start)``: the validated cut body and the index in ``body[field]`` of its
        first item; ``wire`` is None when a new item is invalid (the caller then parses the
        whole body, so that the error names the field by its index in the body).
    """
    raw = body[field]
    start = min(known, len(raw) - 1)
    try:
        return validate({**body, field: raw[start:]}), start
    except RequestFieldError:
        return None, start


def _items_bytes(values: list[Any]) -> memoryview:
    """``marshal`` (format 2: no back-references, so equal values give equal bytes) of the
    items of ``values``, without the list header: the bytes of ``values[:n]`` are a prefix
    of those of ``values``.

    Raises:
        ValueError: ``values`` holds something ``marshal`` cannot write.
    """
    return memoryview(marshal.dumps(values, 2))[5:]  # type byte and 4-byte count


def fingerprint(values: list[Any]) -> bytes | None:
    """A type-exact digest of JSON values (dict key order included), or None when they hold
    something ``marshal`` cannot write."""
    try:
        return hashlib.blake2b(_items_bytes(values), digest_size=16).digest()
    except ValueError:
        return None


class _Known:
    """Raw values a memo entry covers: the objects themselves (the next body, read by the
    session's :class:`~rolloutd.proxy.core.fastjson.BodyReader`, holds the same objects for what
    it resends) and their fingerprint, computed when first needed."""

    __slots__ = ("_digest", "items", "source")

    def __init__(self, items: Sequence[Any], source: list[Any] | None = None) -> None:
        self.items = tuple(items)
        self.source = source  # the body's list they were taken from
        self._digest: bytes | None | bool = False  # False: not computed yet

    def digest(self) -> bytes | None:
        if self._digest is False:
            self._digest = fingerprint(list(self.items))
        return self._digest  # type: ignore[return-value]


@dataclass
class _Translation:
    dialect: str
    context: _Known
    raw: _Known
    messages: tuple[dict[str, Any], ...]
    state: Any


@dataclass
class _HashState:
    head: str
    raw: _Known
    sha: Any  # hashlib sha256 object after the head and the raw messages


#: conversations a memo keeps (sub-agents of one session alternate between theirs)
MAX_CONVERSATIONS = 4


@dataclass
class RequestMemo:
    """What one session's last calls computed for their messages (see the module
    docstring), for up to :data:`MAX_CONVERSATIONS` conversations: concurrent sub-agents
    alternate, and each call reuses what the last call of its own conversation computed.

    Use under the session's calls only: the methods are synchronous, so calls interleaving on
    the event loop see a consistent memo, and every reuse is checked: the same objects, or
    the same fingerprint.
    """

    #: the session's BodyReader, which knows which objects a body took from the last one
    reader: BodyReader | None = None
    #: most recent first; a conversation's newer entry replaces the one it continued
    _translations: list[_Translation] = field(default_factory=list, repr=False)
    _hashes: list[_HashState] = field(default_factory=list, repr=False)
    # the entry the last known_prefix reused: the translation remembered next supersedes it
    _reused: _Translation | None = field(default=None, repr=False)
    # fingerprints of prefixes of one request's message list, from its parse to its hash
    # (the list is held, so its identity stays valid; each parse starts afresh), and the
    # blake2b state after its first _fp_upto items: the longer prefix continues it
    _fp_of: list[Any] | None = field(default=None, repr=False)
    _fps: dict[int, bytes | None] = field(default_factory=dict, repr=False)
    _fp_state: Any = field(default=None, repr=False)
    _fp_upto: int = 0

    def _starts_with(self, raw: list[Any], known: _Known) -> bool:
        """``raw`` starts with the values of ``known``: the very same objects (as the
        session's reader knows, or checked one by one), else the same fingerprint."""
        n = len(known.items)
        if n > len(raw):
            return False
        if (
            self.reader is not None
            and known.source is not None
            and self.reader.continues(raw, known.source, n)
        ):
            return True  # the reader reused those very objects
        if all(map(operator.is_, raw, known.items)):
            return True
        # equal JSON values compare equal, so unequal ones rule the prefix out at the first
        # differing message (a new conversation) without fingerprinting both; equal ones may
        # still differ (1 and 1.0 and true compare equal): the fingerprint decides
        if tuple(raw[:n]) != known.items:
            return False
        digest = known.digest()
        return digest is not None and self._prefix_fingerprint(raw, n) == digest

    def _prefix_fingerprint(self, raw: list[Any], num: int) -> bytes | None:
        """:func:`fingerprint` of ``raw[:num]``; the items are written once per request."""
        if self._fp_of is not raw:
            self._forget_fingerprints()
            self._fp_of = raw
        if num in self._fps:
            return self._fps[num]
        if self._fp_state is not None and num < self._fp_upto:
            digest = fingerprint(raw[:num])
        else:
            state = self._fp_state or hashlib.blake2b(digest_size=16)
            try:
                state.update(_items_bytes(raw[self._fp_upto : num]))
            except ValueError:
                self._fps[num] = None
                return None
            self._fp_state, self._fp_upto = state, num
            digest = state.copy().digest()
        self._fps[num] = digest
        return digest

    def _forget_fingerprints(self) -> None:
        self._fp_of, self._fps, self._fp_state, self._fp_upto = None, {}, None, 0

    # -- translation -------------------------------------------------------------------
    def known_prefix(
        self, dialect: str, context: Any, raw: Any
    ) -> tuple[int, Sequence[dict[str, Any]], Any]:
        """How much of ``raw`` the last translation covers.

        Args:
            dialect: the dialect translating.
            context: the raw request values other than the messages that their translation
                depends on (Anthropic's ``system``), compared by :func:`fingerprint`.
            raw: the request's raw messages (the JSON list).

        Returns:
            ``(n, messages, state)``: the first ``n`` raw messages are those translated last
            time into ``messages`` (internal shape; shared with earlier requests and their
            completions: never modified), with the dialect's carried ``state``;
            ``(0, (), None)`` when nothing is reusable.
        """
        self._forget_fingerprints()
        self._reused = None
        if not isinstance(raw, list):
            return 0, (), None
        best: _Translation | None = None
        for memo in self._translations:
            if memo.dialect != dialect or (
                best is not None and len(memo.raw.items) <= len(best.raw.items)
            ):
                continue
            if memo.context.items[0] is not context and (
                memo.context.digest() is None or memo.context.digest() != fingerprint([context])
            ):
                continue
            if self._starts_with(raw, memo.raw):
                best = memo
        if best is None:
            return 0, (), None
        self._reused = best
        return len(best.raw.items), best.messages, best.state

    def remember(
        self,
        dialect: str,
        context: Any,
        raw: Any,
        messages: list[dict[str, Any]],
        state: Any = None,
    ) -> None:
        """Keep a successful translation of ``raw`` (the whole raw message list) into
        ``messages`` for the next call (the list is copied, its messages are not: nothing
        modifies an internal message once translated)."""
        if not isinstance(raw, list) or not raw:
            return
        entry = _Translation(dialect, _Known([context]), _Known(raw, raw), tuple(messages), state)
        # the entry this one continues is superseded
        reused, self._reused = self._reused, None
        kept = [m for m in self._translations if m is not reused]
        self._translations = [entry, *kept][:MAX_CONVERSATIONS]

    # -- retry hash --------------------------------------------------------------------
    def request_hash(self, body: dict[str, Any], dialect: str = "") -> str:
        """:func:`request_hash` of ``body`` (the same value), with
        the sha256 state after the messages the last call hashed reused when ``body``
        resends them: the cost is that of the new messages and the other fields."""
        body = identity_body(body, dialect)
        split = _split(body)
        if split is None:
            self._forget_fingerprints()
            return request_hash(body)  # volatile fields are out already
        head, raw, tail = split
        best: _HashState | None = None
        for memo in self._hashes:
            if (
                memo.head == head
                and (best is None or len(memo.raw.items) > len(best.raw.items))
                and self._starts_with(raw, memo.raw)
            ):
                best = memo
        if best is not None:
            sha, start = best.sha.copy(), len(best.raw.items)
        else:
            sha, start = hashlib.sha256(head.encode()), 0
        for i in range(start, len(raw)):
            sha.update(("," + canonical_json(raw[i]) if i else canonical_json(raw[i])).encode())
        kept = [m for m in self._hashes if m is not best]
        self._hashes = [_HashState(head, _Known(raw, raw), sha.copy()), *kept][:MAX_CONVERSATIONS]
        self._forget_fingerprints()
        sha.update(tail.encode())
        return sha.hexdigest()


def _split(body: Any) -> tuple[str, list[Any], str] | None:
    """``canonical_json(body)`` cut around its conversation list: ``head + "[" ...`` up to the
    list's first element, the list, and what follows its last element; None when the body has
    no such list (or keys :func:`canonical_json` could not sort)."""
    if not isinstance(body, dict) or not all(isinstance(k, str) for k in body):
        return None
    name = next((f for f in CONVERSATION_FIELDS if isinstance(body.get(f), list)), None)
    if name is None:
        return None
    before, after = [], []
    for key, value in sorted(body.items()):
        if key != name:
            (before if key < name else after).append(
                f"{canonical_json(key)}:{canonical_json(value)}"
            )
    head = "{" + "".join(part + "," for part in before) + canonical_json(name) + ":["
    tail = "]" + "".join("," + part for part in after) + "}"
    return head, body[name], tail
