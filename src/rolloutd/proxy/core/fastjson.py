"""JSON the gateway reads and writes per call (request bodies, backend request bodies),
through orjson when it is installed (a dependency).

orjson writes a 6,000-token prompt five times faster than the standard library, and reads a
200-turn conversation's body (20 KB) in half the time (both grow with the conversation, and a
call's cost must not).
Values and errors are the standard library's: what orjson cannot write (integers beyond 64
bits, non-string keys) and NaN or infinities (which orjson writes as null) go to :mod:`json`;
a text orjson refuses (NaN, infinities, lone surrogates) or may read differently (an integer
of 19 digits or more: orjson reads one beyond 64 bits as a float) is read by :mod:`json`.

:func:`canonical_json` is the one canonical text (sorted keys, no spaces) that hashes and
comparisons use. :class:`BodyReader` reads a session's request bodies, each as :func:`loads`
would, without parsing again the conversation the session's last body sent (a call's cost must
not grow with the conversation).
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import math
import re
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency
    orjson = None  # type: ignore[assignment]


#: digits to "0", every other byte to " ": a run of 19 zeros is a digit run that could be an
#: integer beyond 64 bits (orjson would read it as a float); 10x faster than a regex search
_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_LONG_RUN = b"0" * 19


def canonical_json(obj: Any) -> str:
    """Canonical JSON text: sorted keys, no spaces, UTF-8 kept (hashing and comparisons:
    :func:`rolloutd.proxy.core.request_identity.request_hash`, a conversation's tools). The
    standard library's writer: the text is part of stored request hashes, so it never changes
    with the writer installed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def loads(data: bytes | bytearray) -> Any:
    """``json.loads(data)``: the same values, and the same errors.

    Raises:
        json.JSONDecodeError: not JSON.
        UnicodeDecodeError: not UTF-8.
    """
    if orjson is not None and _LONG_RUN not in data.translate(_DIGITS):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # the standard library decides (it accepts NaN, reports its own error)
    return json.loads(data)


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON of ``obj``: ``json.dumps(obj, ensure_ascii=False,
    separators=(",", ":"), allow_nan=False).encode()``, numbers written in their shortest
    form (``1e-05`` may come out as ``1e-5``: the same value).

    Raises:
        ValueError: ``obj`` holds NaN or an infinity (as :func:`json.dumps` with
            ``allow_nan=False``).
        TypeError: ``obj`` holds something JSON cannot carry.
    """
    if orjson is not None:
        try:
            out = orjson.dumps(obj)
        except TypeError:
            pass  # integers beyond 64 bits, non-str keys: the standard library decides
        else:
            # orjson writes NaN and infinities as null; the standard library refuses them
            if b"null" not in out or not _has_nan(obj):
                return out
    return json.dumps(
        obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_fragment_value
    ).encode()


def _fragment_value(obj: Any) -> Any:
    """For :func:`json.dumps`: the value of a :func:`raw` text."""
    if orjson is not None and isinstance(obj, orjson.Fragment):
        return json.loads(obj.contents)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def raw(text: bytes) -> Any:
    """A value :func:`dumps` writes as ``text``, JSON written already (``orjson.Fragment``;
    without orjson, the value read back)."""
    return orjson.Fragment(text) if orjson is not None else json.loads(text)


class ListJson:
    """The JSON text of a list that grows at its end, written once: a session's prompts
    (token ids), each the one before, what was sampled and the new turn (the token chain of
    :mod:`rolloutd.proxy.render.chat_template`). A prompt of 4,300 ids costs orjson 220 K
    instructions to write whole, on every call of the conversation (a call's cost must not
    grow with it); continued, only the new ids are written.

    One per session; not for concurrent use.
    """

    __slots__ = ("_items", "_text")

    def __init__(self) -> None:
        self._items: list[int] | None = None
        self._text = b""

    def dumps(self, items: list[int], base: list[int] | None = None) -> bytes:
        """``dumps(items)``, a JSON array of integers.

        Args:
            items: the list to write.
            base: a list ``items`` starts with (the caller's invariant: a chained prompt
                starts with the prompt it continues, :meth:`rolloutd.proxy.render.chat_template.
                ChatTemplate.build_prompt`), or None. When it is the very list this wrote
                last, only what ``items`` adds to it is written.

        Raises:
            TypeError, ValueError: as :func:`dumps`.
        """
        if base is not None and base is self._items and base and len(items) >= len(base):
            rest = items[len(base) :]
            text = (
                self._text
                if not rest
                else b"".join((memoryview(self._text)[:-1], b",", memoryview(dumps(rest))[1:]))
            )
        else:
            text = dumps(items)
        self._items, self._text = items, text
        return text


_SCALARS = frozenset({str, int, bool, type(None)})


def _has_nan(obj: Any) -> bool:
    """Whether ``obj`` holds NaN or an infinity at any depth (orjson wrote it, so it nests
    no deeper than orjson's limit). One type test per value, no recursion: a conversation of
    400 tool-call messages in about a tenth of a recursive walk's time."""
    stack = [obj]
    pop, extend = stack.pop, stack.extend
    while stack:
        value = pop()
        kind = type(value)
        if kind in _SCALARS:
            continue
        if kind is float:
            if value - value != 0.0:  # NaN and infinities only
                return True
        elif kind is dict:
            extend(value.values())
        elif kind is list or kind is tuple:
            extend(value)
        elif isinstance(value, float):
            if not math.isfinite(value):
                return True
        elif isinstance(value, dict):
            extend(value.values())
        elif isinstance(value, list | tuple):
            extend(value)
    return False


_WHITESPACE = re.compile(r"[ \t\n\r]*")
_scan_once = json.scanner.make_scanner(json.JSONDecoder())  # json.loads' own value scanner


class _Fallback(Exception):
    """The body is not one :class:`BodyReader` reads itself: :func:`loads` decides."""


class BodyReader:
    """Reads one session's request bodies, each as :func:`loads` reads it (the same values,
    the same errors), parsing again only what follows the part of the conversation the
    session's last body sent.

    A harness resends its whole conversation on every call, serialised as before: the body
    of turn 200 starts with the text of turn 199's body up to its last message. The reader
    keeps that text with its parsed fields and messages; a body that starts with it reuses
    them and parses the rest with :mod:`json`'s scanner (``json.loads`` itself). Otherwise
    it reuses the longest run of whole items it shares, or parses it whole. Equal text
    parses to equal values (JSON's grammar has no context), and the text after a reused item
    must go on with ``,`` or ``]``, which no value's text continues with (``1`` followed by
    ``2`` is another number, and an error here: the body is then read whole), so reuse is
    exact; a later duplicate of a field is read as ``json.loads`` reads it (the last wins).

    The messages reused are the objects the last body holds, not copies: bodies are read,
    never modified (the memo and the completion log share them too,
    :mod:`rolloutd.proxy.core.request_identity`). Memory: the last body's text and values.

    Args:
        fields: the body fields that may hold the conversation, a list of objects (the first
            one found is the one reused).
    """

    def __init__(self, fields: tuple[str, ...] = ("messages", "contents", "input")) -> None:
        self.fields = fields
        self._text = ""  # the last body's text up to the end of its last conversation item
        self._ends: list[int] = []  # where each conversation item ends in _text
        self._head: list[tuple[str, Any]] = []  # the fields before the conversation
        self._field = ""
        self._items: list[Any] = []  # a copy: the body's list is the caller's
        # the conversation list of the last body read, the one of the body before it, and
        # how many items the first took from the second (:meth:`continues`)
        self._returned: list[Any] | None = None
        self._returned_before: list[Any] | None = None
        self._reused = 0
        #: where the last body's text stopped matching the one before it (bytes; 0: nowhere,
        #: or a text that is not ASCII): what comes before was read in that body
        self.reused_bytes = 0

    def loads(self, data: bytes | bytearray) -> Any:
        """``json.loads(data)``: the same values, and the same errors (:func:`loads`).

        Raises:
            json.JSONDecodeError: not JSON.
            UnicodeDecodeError: not UTF-8.
        """
        try:
            text = data.decode("utf-8")
            return self._read(text)
        except (_Fallback, ValueError, StopIteration, RecursionError, IndexError):
            self.forget()
            return loads(data)

    def forget(self) -> None:
        """Reuse nothing of the bodies read so far (a caller refused the last one)."""
        self._text, self._ends, self._head, self._field, self._items = "", [], [], "", []
        self._returned = self._returned_before = None
        self._reused = self.reused_bytes = 0

    def continues(self, items: list[Any], earlier: list[Any], num: int) -> bool:
        """Whether ``items`` is the conversation list of the last body read and its first
        ``num`` items are those of ``earlier``, the one of the body read before it: the very
        same objects (known without comparing them)."""
        return items is self._returned and earlier is self._returned_before and num <= self._reused

    def _reusable(self, text: str) -> int:
        """How many of the last body's conversation items ``text`` starts with (their text,
        and the fields before them)."""
        ends = self._ends
        if not ends or not text.startswith(self._text[: ends[0]]):
            return 0
        if text.startswith(self._text):
            return len(ends)
        low, high = 1, len(ends) - 1  # text starts with the first `low` items, not `high + 1`
        while low < high:
            mid = (low + high + 1) // 2
            if text.startswith(self._text[: ends[mid - 1]]):
                low = mid
            else:
                high = mid - 1
        return low

    def _read(self, text: str) -> Any:
        """``json.loads(text)``, reusing what the last body shares with it; the reader keeps
        this body for the next one.

        Raises:
            _Fallback, ValueError, StopIteration, IndexError: not a body read here (the
                caller reads it with :func:`loads`, which gives the value or the error).
        """
        reused = self._reusable(text)
        if reused:
            field, head = self._field, self._head
            items, ends = self._items[:reused], self._ends[:reused]
            obj = dict(head)
            obj[field] = items
            at = _WHITESPACE.match(text, self._rest_of_items(text, ends[-1], items, ends)).end()
            if text[at] == ",":
                at, _ = self._fields(
                    text, _WHITESPACE.match(text, at + 1).end(), obj, None, items, ends
                )
            elif text[at] == "}":
                at += 1
            else:
                raise _Fallback
        else:
            obj, head, items, ends = {}, [], [], []
            at = _WHITESPACE.match(text, 0).end()
            if text[at] != "{":
                raise _Fallback
            at = _WHITESPACE.match(text, at + 1).end()
            if text[at] == "}":
                at, field = at + 1, ""
            else:
                at, field = self._fields(text, at, obj, head, items, ends)
        if _WHITESPACE.match(text, at).end() != len(text):
            raise _Fallback  # extra data: json.loads reports it
        if field and items:
            self._returned_before = self._returned if reused else None
            self._returned, self._reused = items, reused
            self.reused_bytes = ends[reused - 1] if reused and text.isascii() else 0
            self._text, self._ends, self._field, self._head = text[: ends[-1]], ends, field, head
            self._items = items.copy()
        else:
            self.forget()
        return obj

    def _fields(
        self,
        text: str,
        at: int,
        obj: dict[str, Any],
        head: list[tuple[str, Any]] | None,
        items: list[Any],
        ends: list[int],
    ) -> tuple[int, str]:
        """Read ``"key": value`` pairs into ``obj`` from ``at`` through the closing brace.

        With ``head`` (the conversation not read yet): the first of :attr:`fields` holding a
        list is the conversation, its items go to ``items`` (ending at ``ends``) and the
        pairs before it to ``head``. Returns the index after the brace and the
        conversation's field ("" when none)."""
        field = ""
        while True:
            if text[at] != '"':
                raise _Fallback
            key, at = json.decoder.scanstring(text, at + 1)
            at = _WHITESPACE.match(text, at).end()
            if text[at] != ":":
                raise _Fallback
            at = _WHITESPACE.match(text, at + 1).end()
            if (
                head is not None
                and not field
                and key in self.fields
                and text[at] == "["
                and key not in obj
            ):
                field = key
                obj[key] = items
                at = _WHITESPACE.match(text, at + 1).end()
                if text[at] == "]":
                    at += 1
                else:
                    value, at = _scan_once(text, at)
                    items.append(value)
                    ends.append(at)
                    at = self._rest_of_items(text, at, items, ends)
            else:
                value, at = _scan_once(text, at)
                obj[key] = value
                if head is not None and not field:
                    head.append((key, value))
            at = _WHITESPACE.match(text, at).end()
            if text[at] == ",":
                at = _WHITESPACE.match(text, at + 1).end()
            elif text[at] == "}":
                return at + 1, field
            else:
                raise _Fallback

    @staticmethod
    def _rest_of_items(text: str, at: int, items: list[Any], ends: list[int]) -> int:
        """Read the conversation's items after one that ends at ``at``, through the closing
        bracket; returns the index after it."""
        while True:
            at = _WHITESPACE.match(text, at).end()
            if text[at] == "]":
                return at + 1
            if text[at] != ",":
                raise _Fallback
            value, at = _scan_once(text, _WHITESPACE.match(text, at + 1).end())
            items.append(value)
            ends.append(at)
