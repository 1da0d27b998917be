"""OpenAI chat messages as the token chain compares them: their text, canonical JSON, the
signature that makes two messages the same turn, the shape chat templates expect, and the
index of a session's completions by the signature of their answer.

Split from :mod:`rolloutd.proxy.render.chat_template`, which re-exports every name here.
"""

from __future__ import annotations

import bisect
import contextlib
import json
from collections.abc import Sequence
from typing import Any

from rolloutd.errors import InvalidRequestError
from rolloutd.proxy.core.fastjson import canonical_json
from rolloutd.types import Completion


def content_text(content: Any) -> str:
    """The text of an OpenAI message ``content``: a string, a list of text parts, or None.

    Raises:
        InvalidRequestError: a part that is not text (images are not supported yet).
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in (
                "text",
                "input_text",
                "output_text",
            ):
                texts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise InvalidRequestError(f"content part of type {kind!r} is not supported")
        return "".join(texts)
    raise InvalidRequestError(f"message content of type {type(content).__name__} is not valid")


def _canonical_arguments(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return canonical_json(json.loads(arguments))
        except json.JSONDecodeError:
            return arguments.strip()
    return canonical_json(arguments)


def message_signature(message: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two messages the same turn, for matching a request against the log.

    Harnesses echo an assistant answer back with cosmetic changes (``content`` None vs "",
    surrounding whitespace, tool call ids, re-serialised arguments), so the signature keeps the
    normalised role, the stripped text and each tool call's name and canonical arguments.

    Args:
        message: one OpenAI chat message.

    Returns:
        A hashable tuple ``(role, text, ((name, arguments_json), ...))``.
    """
    role = message.get("role")
    if role == "developer":
        role = "system"
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        calls.append((function.get("name"), _canonical_arguments(function.get("arguments", {}))))
    return (role, content_text(message.get("content")).strip(), tuple(calls))


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages in the shape chat templates expect.

    Content becomes a string; ``developer`` becomes ``system``; tool call ``arguments`` JSON
    strings become objects (templates apply ``tojson`` to them, as in Qwen2.5's).

    Args:
        messages: OpenAI chat messages.

    Returns:
        New message dicts; the input is not modified.
    """
    out = []
    for message in messages:
        msg = dict(message)
        if msg.get("role") == "developer":
            msg["role"] = "system"
        msg["content"] = content_text(msg.get("content"))
        if msg.get("tool_calls"):
            calls = []
            for call in msg["tool_calls"]:
                call = dict(call)
                function = dict(call.get("function") or {})
                arguments = function.get("arguments", {})
                if isinstance(arguments, str):
                    # unparseable arguments are rendered as the string the model wrote
                    with contextlib.suppress(json.JSONDecodeError):
                        function["arguments"] = json.loads(arguments)
                call["function"] = function
                calls.append(call)
            msg["tool_calls"] = calls
        out.append(msg)
    return out


class ExtensionIndex:
    """A session's completions by (number of messages, signature of the answer): the
    candidates a request can continue, found without scanning the session's log
    (:meth:`ChatTemplate.find_extended`).

    Only completions that can be continued are kept: at least one sampled token and not
    ended by an error. Within one key, completions keep index order.

    Args:
        completions: completions to index, in index order.
    """

    def __init__(self, completions: Sequence[Completion] = ()) -> None:
        self._by_key: dict[tuple[int, tuple[Any, ...]], list[Completion]] = {}
        self._lengths: list[int] = []  # distinct numbers of messages, ascending
        for completion in completions:
            self.add(completion)

    def add(self, completion: Completion) -> None:
        """Index ``completion`` (the session's newest)."""
        if not completion.response_ids or completion.finish_reason == "error":
            return
        k = len(completion.messages)
        key = (k, message_signature(completion.response_message))
        self._by_key.setdefault(key, []).append(completion)
        position = bisect.bisect_left(self._lengths, k)
        if position == len(self._lengths) or self._lengths[position] != k:
            self._lengths.insert(position, k)

    def lengths_below(self, num_messages: int) -> list[int]:
        """The indexed conversation lengths ``k < num_messages``, longest first."""
        return self._lengths[: bisect.bisect_left(self._lengths, num_messages)][::-1]

    def candidates(self, k: int, answer_signature: tuple[Any, ...]) -> list[Completion]:
        """Completions of ``k`` messages whose answer has ``answer_signature``, latest
        first."""
        return self._by_key.get((k, answer_signature), [])[::-1]
