"""Tool-call parsers: sampled text -> OpenAI ``tool_calls`` plus the remaining content.

Parsers are looked up by name in :data:`TOOL_PARSERS` (``hermes`` as in vLLM's
``--tool-call-parser``), so a model family with another tool-call syntax adds one entry here.

The ``hermes`` parser reads the format Qwen2.5's and Hermes' chat templates teach the model::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(Qwen2.5 model card, "Function calling"; vLLM ``hermes_tool_parser.py``.)

``llama3_json`` reads Llama 3.1+'s JSON calls, ``{"name": ..., "parameters": {...}}``,
optionally after ``<|python_tag|>``, several separated by ``;`` (Meta's Llama 3.1 prompt
format, "JSON based tool calling"; vLLM ``llama_tool_parser.py``). ``mistral`` reads
``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` (tokenizer v3-v7) and
``[TOOL_CALLS]name[ARGS]{...}`` (v11+; vLLM ``mistral_tool_parser.py``).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rolloutd.errors import ConfigError

HERMES_START = "<tool_call>"
HERMES_END = "</tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL)


@dataclass
class ParsedOutput:
    """What a parser found in sampled text.

    Attributes:
        content: the text that is not a tool call, stripped; None when the text held only
            tool calls (OpenAI's convention for a pure tool-call message).
        tool_calls: OpenAI tool calls: ``{"id": "call_...", "type": "function",
            "function": {"name": str, "arguments": str (JSON)}}``.
        num_unreadable: tool calls the model began but the parser could not read (malformed
            JSON, no name, no closing marker): the model's doing, left in the content
            (counted by the parsers that can tell; ``hermes`` and ``hermes_lenient``).
    """

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    num_unreadable: int = 0


def new_tool_call_id() -> str:
    """A fresh OpenAI-style tool call id, ``call_`` plus 24 random characters."""
    return "call_" + secrets.token_hex(12)


def _call_from_object(obj: Any) -> dict[str, Any] | None:
    """One OpenAI tool call from a ``{"name", "arguments"}`` object; None when malformed."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        # Some models emit the arguments JSON-encoded already; keep it when it parses.
        try:
            json.loads(arguments)
        except json.JSONDecodeError:
            return None
        arguments_json = arguments
    else:
        arguments_json = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": new_tool_call_id(),
        "type": "function",
        "function": {"name": obj["name"], "arguments": arguments_json},
    }


def _hermes_call(block: str) -> dict[str, Any] | None:
    """One tool call from the JSON inside a ``<tool_call>`` block; None when it is malformed."""
    try:
        return _call_from_object(json.loads(block))
    except json.JSONDecodeError:
        return None


def parse_hermes(text: str) -> ParsedOutput:
    """Parse Qwen/Hermes ``<tool_call>{...}</tool_call>`` blocks.

    A block whose JSON is malformed (or lacks a ``name``) is left in the content untouched, so
    nothing the model wrote is lost. When no valid block is found the content is the text as is.

    Args:
        text: the sampled text, end-of-turn token excluded.

    Returns:
        The content without the valid blocks (stripped; None when empty) and the tool calls in
        the order they were written.
    """
    tool_calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = end = unreadable = 0
    for match in _HERMES_BLOCK.finditer(text):
        end = match.end()
        call = _hermes_call(match.group(1))
        if call is None:
            unreadable += 1
            continue
        kept.append(text[pos : match.start()])
        pos = match.end()
        tool_calls.append(call)
    if HERMES_START in text[end:]:
        unreadable += 1  # a call begun and never closed (cut by max_tokens, or malformed)
    if not tool_calls:
        return ParsedOutput(content=text, num_unreadable=unreadable)
    kept.append(text[pos:])
    content = "".join(kept).strip()
    return ParsedOutput(content=content or None, tool_calls=tool_calls, num_unreadable=unreadable)


def _bare_json_calls(text: str) -> list[dict[str, Any]] | None:
    """Tool calls when the whole text is one JSON call object or a list of them."""
    body = text.strip()
    fence = _FENCE.fullmatch(body)
    if fence:
        body = fence.group(1).strip()
    if not body.startswith(("{", "[")):
        return None
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        # a small model's call that stopped before its last brace or two (seen from
        # Qwen2.5-Coder-0.5B: '{"name": ..., "arguments": {...}' then end of turn)
        missing = body.count("{") - body.count("}")
        if not 1 <= missing <= 2 or not body.startswith("{"):
            return None
        try:
            obj = json.loads(body + "}" * missing)
        except json.JSONDecodeError:
            return None
    items = obj if isinstance(obj, list) else [obj]
    calls = [
        _call_from_object(item) if isinstance(item, dict) and "arguments" in item else None
        for item in items
    ]
    if not calls or any(call is None for call in calls):
        return None
    return calls  # type: ignore[return-value]


def parse_hermes_lenient(text: str) -> ParsedOutput:
    """:func:`parse_hermes`, plus a whole answer that is a bare JSON call as a tool call.

    Small models (Qwen2.5-Coder-0.5B) often answer ``{"name": ..., "arguments": {...}}``
    without the ``<tool_call>`` tags, sometimes inside a Markdown code fence, sometimes one or
    two closing braces short (those are added when the result then parses). The trace keeps
    the sampled tokens either way; only the harness's view changes.
    """
    parsed = parse_hermes(text)
    if parsed.tool_calls:
        return parsed
    calls = _bare_json_calls(text)
    return ParsedOutput(content=None, tool_calls=calls) if calls else parsed


def streamable_lenient(text: str) -> str:
    """Streamable content for :func:`parse_hermes_lenient`: an answer that starts like JSON
    or a code fence is held back whole (it may be a bare tool call)."""
    if not text.strip() or text.lstrip()[0] in "{[`":
        return ""
    return streamable_prefix(text, HERMES_START)


LLAMA_PYTHON_TAG = "<|python_tag|>"
MISTRAL_TOOL_CALLS = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"


def _json_values(text: str, separators: str) -> list[Any] | None:
    """Consecutive JSON values filling ``text``, split by ``separators``; None otherwise."""
    decoder = json.JSONDecoder()
    values, pos = [], 0
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] in separators):
            pos += 1
        if pos == len(text):
            return values or None
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return None
        values.append(value)


def parse_llama3_json(text: str) -> ParsedOutput:
    """Parse Llama 3 JSON tool calls: the whole answer is one or more call objects.

    Anything else (prose, a JSON object without ``name``) is content, untouched.
    """
    body = text.strip()
    body = body.removeprefix(LLAMA_PYTHON_TAG)
    if not body.lstrip().startswith("{"):
        return ParsedOutput(content=text)
    values = _json_values(body, ";")
    calls = [_call_from_object(v) for v in values or []]
    if not calls or any(call is None for call in calls):
        return ParsedOutput(content=text)
    return ParsedOutput(content=None, tool_calls=calls)  # type: ignore[arg-type]


def streamable_llama3_json(text: str) -> str:
    """Streamable content for :func:`parse_llama3_json`: an answer that starts like a call
    (``{`` or ``<|python_tag|>``) is held back whole."""
    stripped = text.lstrip()
    if (
        not stripped
        or stripped.startswith(("{", LLAMA_PYTHON_TAG))
        or LLAMA_PYTHON_TAG.startswith(stripped)
    ):
        return ""
    return text.rstrip()


def _mistral_calls(tail: str) -> list[dict[str, Any]] | None:
    """The calls after the first ``[TOOL_CALLS]``, in either Mistral syntax; None if malformed."""
    if MISTRAL_ARGS in tail:
        calls = []
        for segment in tail.split(MISTRAL_TOOL_CALLS):
            name, sep, arguments = segment.partition(MISTRAL_ARGS)
            if not sep:
                return None
            try:
                call = _call_from_object({"name": name.strip(), "arguments": json.loads(arguments)})
            except json.JSONDecodeError:
                return None
            if call is None:
                return None
            calls.append(call)
        return calls
    values = _json_values(tail, "")
    if not values:
        return None
    items = [item for value in values for item in (value if isinstance(value, list) else [value])]
    parsed = [_call_from_object(item) for item in items]
    return None if not parsed or any(c is None for c in parsed) else parsed  # type: ignore[return-value]


def parse_mistral(text: str) -> ParsedOutput:
    """Parse Mistral ``[TOOL_CALLS]`` calls; the text before the marker is the content.

    A malformed call section leaves the whole text as content.
    """
    cut = text.find(MISTRAL_TOOL_CALLS)
    if cut < 0:
        return ParsedOutput(content=text)
    calls = _mistral_calls(text[cut + len(MISTRAL_TOOL_CALLS) :].strip())
    if not calls:
        return ParsedOutput(content=text)
    return ParsedOutput(content=text[:cut].strip() or None, tool_calls=calls)


def parse_none(text: str) -> ParsedOutput:
    """No tool-call syntax: everything is content."""
    return ParsedOutput(content=text)


@dataclass(frozen=True)
class ToolParser:
    """A registered parser.

    Attributes:
        name: registry name.
        parse: sampled text -> :class:`ParsedOutput`.
        streamable: text sampled so far -> the prefix that can be streamed as content (never
            part of a tool call).
    """

    name: str
    parse: Callable[[str], ParsedOutput]
    streamable: Callable[[str], str]


def _hermes_streamable(text: str) -> str:
    return streamable_prefix(text, HERMES_START)


#: parser name -> parser
TOOL_PARSERS: dict[str, ToolParser] = {
    "hermes": ToolParser("hermes", parse_hermes, _hermes_streamable),
    "hermes_lenient": ToolParser("hermes_lenient", parse_hermes_lenient, streamable_lenient),
    "llama3_json": ToolParser("llama3_json", parse_llama3_json, streamable_llama3_json),
    "mistral": ToolParser(
        "mistral", parse_mistral, lambda text: streamable_prefix(text, MISTRAL_TOOL_CALLS)
    ),
    "none": ToolParser("none", parse_none, str),
}


def get_tool_parser(name: str) -> ToolParser:
    """The parser registered as ``name``.

    Raises:
        ConfigError: no parser of that name.
    """
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown tool parser {name!r}; known: {', '.join(sorted(TOOL_PARSERS))}"
        ) from None


def streamable_prefix(text: str, start_marker: str | None) -> str:
    """The part of a growing sampled text that can be streamed as content already.

    Content stops at the first tool-call marker; a tail that could still become the marker
    (``"<tool"``) and trailing whitespace are held back until more text arrives, because the
    final content of a tool-call message is stripped.

    Args:
        text: the text sampled so far.
        start_marker: the parser's tool-call opening text, or None.

    Returns:
        A prefix of ``text``.
    """
    if start_marker:
        cut = text.find(start_marker)
        if cut >= 0:
            return text[:cut].rstrip()
        for n in range(min(len(start_marker) - 1, len(text)), 0, -1):
            if text.endswith(start_marker[:n]):
                text = text[:-n]
                break
    return text.rstrip()
