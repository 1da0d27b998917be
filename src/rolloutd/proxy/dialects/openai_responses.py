"""OpenAI Responses (``POST /v1/responses``): wire models, translation, errors; the answer's
response object (:mod:`.openai_responses_output`) and stream events
(:mod:`.openai_responses_stream`) are their own modules, whose functions this module offers as
the dialect's interface (:class:`rolloutd.proxy.dialects.common.Dialect`).

References: OpenAI API reference, "Responses" (create; input items; the response object)
https://platform.openai.com/docs/api-reference/responses/create and "Streaming events"
https://platform.openai.com/docs/api-reference/responses-streaming ; the Codex CLI's
``codex-rs/core/src/client.rs`` for what a harness sends.

Input items translated to OpenAI chat messages (the internal shape):

- ``instructions`` -> a leading system message; message items (``type`` optional, role
  user/assistant/system/developer, content a string or ``input_text``/``output_text`` parts);
- ``reasoning`` items (``summary[].text`` or ``content[].text``) -> ``reasoning_content`` of
  the assistant turn they open; ``function_call`` -> an assistant ``tool_calls`` entry;
  ``function_call_output`` -> a tool message; ``custom_tool_call`` / ``custom_tool_call_output``
  (Codex's freeform tools) likewise, the input carried as ``{"input": text}``;
- ``previous_response_id`` -> the conversation of that answer (from the session's log) before
  the new items; its instructions are not carried over (as documented).

Tools: ``function`` tools are kept; ``custom`` tools become functions of one string ``input``;
hosted tools (web_search, file_search, ...) are dropped: no backend can run them.
Kept sampling fields: ``temperature``, ``top_p``, ``max_output_tokens``. Ignored knowingly:
``store``, ``reasoning``, ``include``, ``text``, ``tool_choice``, ``parallel_tool_calls``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field

from rolloutd.errors import RequestFieldError, RolloutdError
from rolloutd.proxy.core.call_types import (
    InternalRequest,
    SamplingOverrides,
)
from rolloutd.proxy.core.request_identity import RequestMemo, validate_new_items
from rolloutd.proxy.dialects import openai_chat
from rolloutd.proxy.dialects.common import validate
from rolloutd.proxy.dialects.openai_responses_output import (
    output_items,
    response_json,
    response_to_internal,
    wire_id,
)
from rolloutd.proxy.dialects.openai_responses_stream import Encoder, collect_stream, encoder
from rolloutd.proxy.render.messages import content_text

log = structlog.get_logger(__name__)

#: the dialect's interface (:class:`rolloutd.proxy.dialects.common.Dialect`), part of it
#: defined in the answer and stream modules
__all__ = [
    "DIALECT",
    "Encoder",
    "collect_stream",
    "encoder",
    "error_body",
    "input_tokens_json",
    "output_items",
    "parse",
    "request_from_internal",
    "response_json",
    "response_to_internal",
    "to_internal",
    "wire_id",
]

DIALECT = "openai_responses"
CUSTOM_INPUT_SCHEMA = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
}


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class ResponsesRequest(_Wire):
    """``POST /v1/responses`` body (items are checked one by one in :func:`to_internal`)."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=5.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_output_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    previous_response_id: str | None = None


class MessageItem(_Wire):
    """A message input item (``type`` may be omitted: the "easy input message")."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Any]


class FunctionCallItem(_Wire):
    """A ``function_call`` (or ``custom_tool_call``) item the model produced earlier."""

    type: Literal["function_call", "custom_tool_call"]
    call_id: str
    name: str
    arguments: str | None = None
    input: str | None = None


class FunctionCallOutputItem(_Wire):
    """A ``function_call_output`` (or ``custom_tool_call_output``) item: a tool's result."""

    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: str
    output: str | list[Any]


class ReasoningItem(_Wire):
    """A ``reasoning`` item: summary parts and/or reasoning text parts."""

    type: Literal["reasoning"]
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None


_ITEMS: dict[str, type[_Wire]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "custom_tool_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "custom_tool_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


# --------------------------------------------------------------------------- requests


def _item(raw: Any, i: int) -> _Wire:
    kind = raw.get("type", "message") if isinstance(raw, dict) else None
    model = _ITEMS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise RequestFieldError(
            f"input item of type {kind!r} is not supported", param=f"input.{i}.type"
        )
    try:
        return validate(model, raw)
    except RequestFieldError as e:
        param = f"input.{i}.{e.param}" if e.param else f"input.{i}"
        raise RequestFieldError(
            f"invalid request: {param}: {e.message.split(': ')[-1]}", param=param
        ) from None


def _open_assistant(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant turn a reasoning/call item belongs to: the last message if it is an
    assistant turn, else a new one."""
    if messages and messages[-1]["role"] == "assistant":
        return messages[-1]
    messages.append({"role": "assistant", "content": None})
    return messages[-1]


def _tool(tool: dict[str, Any]) -> dict[str, Any] | None:
    kind = tool.get("type")
    if kind == "function" and isinstance(tool.get("name"), str):
        function = {"name": tool["name"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        if tool.get("parameters") is not None:
            function["parameters"] = tool["parameters"]
        return {"type": "function", "function": function}
    if kind == "custom" and isinstance(tool.get("name"), str):
        function = {"name": tool["name"], "parameters": CUSTOM_INPUT_SCHEMA}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        return {"type": "function", "function": function}
    log.debug("responses_tool_dropped", tool_type=kind)
    return None


def _head(request: ResponsesRequest, previous: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The messages before the input items: the instructions, then the conversation of
    ``previous_response_id`` (its own system messages left out; copies)."""
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if previous:
        leading = 0
        while leading < len(previous) and previous[leading]["role"] == "system":
            leading += 1
        # copies down to the tool call list: the input's items may complete the last turn,
        # and the recorded conversation must not change
        messages += [
            {**m, "tool_calls": list(m["tool_calls"])} if m.get("tool_calls") else dict(m)
            for m in previous[leading:]
        ]
    return messages


def _items(request: ResponsesRequest) -> list[dict[str, Any]]:
    return (
        [{"role": "user", "content": request.input}]
        if isinstance(request.input, str)
        else request.input
    )


def _translate_items(
    items: list[dict[str, Any]], first: int, messages: list[dict[str, Any]]
) -> None:
    """Translate input items that stand at ``input.{first}`` on onto ``messages``: appends,
    and may complete its last message (an assistant turn's reasoning, text and calls come as
    separate items)."""
    for i, raw in enumerate(items, first):
        item = _item(raw, i)
        if isinstance(item, MessageItem):
            text = content_text(item.content)
            last = messages[-1] if messages else None
            if (
                item.role == "assistant"
                and last is not None
                and last["role"] == "assistant"
                and last["content"] is None
                and not last.get("tool_calls")
            ):
                last["content"] = text  # the message after its reasoning item
            else:
                messages.append(
                    {"role": "system" if item.role == "developer" else item.role, "content": text}
                )
        elif isinstance(item, ReasoningItem):
            parts = item.content if item.content else item.summary
            text = "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
            turn = _open_assistant(messages)
            if turn["content"] is not None or turn.get("tool_calls"):
                messages.append({"role": "assistant", "content": None})
                turn = messages[-1]
            turn["reasoning_content"] = text
        elif isinstance(item, FunctionCallItem):
            arguments = (
                json.dumps({"input": item.input or ""}, ensure_ascii=False)
                if item.type == "custom_tool_call"
                else item.arguments or "{}"
            )
            turn = _open_assistant(messages)
            turn.setdefault("tool_calls", []).append(
                {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": arguments},
                }
            )
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": content_text(item.output)}
            )


def to_internal(
    request: ResponsesRequest,
    body: dict[str, Any],
    *,
    previous: list[dict[str, Any]] | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> InternalRequest:
    """Translate a validated request (pure).

    Args:
        request: the validated wire request.
        body: the raw body (recorded and hashed as sent).
        previous: the conversation of ``previous_response_id`` (its messages and answer).
        messages: the translation of the instructions and input when the caller has it
            already (:func:`parse` with a memo); default: translated here.

    Raises:
        RequestFieldError: an unsupported item or content part.
    """
    if messages is None:
        messages = _head(request, previous)
        _translate_items(_items(request), 0, messages)
    if not messages:
        raise RequestFieldError("input holds no message", param="input")
    tools = [
        t
        for t in (_tool(raw) for raw in request.tools or [] if isinstance(raw, dict))
        if t is not None
    ]
    return InternalRequest(
        dialect=DIALECT,
        model=request.model,
        messages=messages,
        tools=tools,
        sampling=SamplingOverrides(
            temperature=request.temperature,
            top_p=request.top_p,
            max_tokens=request.max_output_tokens,
        ),
        stream=request.stream,
        body=body,
    )


def parse_request(body: Any) -> ResponsesRequest:
    """Validate a parsed JSON body.

    Raises:
        RequestFieldError: not an object, or an invalid field.
    """
    return validate(ResponsesRequest, body)


def parse(
    body: Any, *, previous: list[dict[str, Any]] | None = None, memo: RequestMemo | None = None
) -> InternalRequest:
    """Validate and translate a body; see :func:`to_internal`.

    Pure without ``memo``. With the session's ``memo`` and no ``previous``, the input items
    the session's last call sent (the same JSON values, at the start of ``input``, after the
    same ``instructions``) are not validated and translated again; the result is the one
    without ``memo`` (a call's cost must not grow with the conversation).
    """
    if memo is None or previous is not None:
        return to_internal(parse_request(body), body, previous=previous)
    raw = body.get("input") if isinstance(body, dict) else None
    instructions = body.get("instructions") if isinstance(body, dict) else None
    known, known_messages, _ = memo.known_prefix(DIALECT, instructions, raw)
    wire: ResponsesRequest | None = None
    if known:
        wire, start = validate_new_items(body, "input", known, parse_request)
        if wire is not None:
            messages = list(known_messages)
            if messages:  # the new items may complete the last message: complete a copy
                last = messages[-1] = dict(messages[-1])
                if "tool_calls" in last:
                    last["tool_calls"] = list(last["tool_calls"])
            assert isinstance(wire.input, list)
            _translate_items(wire.input[known - start :], known, messages)
    if wire is None:
        wire = parse_request(body)
        messages = _head(wire, None)
        _translate_items(_items(wire), 0, messages)
    request = to_internal(wire, body, messages=messages)
    memo.remember(DIALECT, instructions, raw, messages)
    return request


def request_from_internal(request: InternalRequest) -> dict[str, Any]:
    """The Responses body carrying ``request`` (inverse of :func:`parse`; property tests)."""
    messages = list(request.messages)
    body: dict[str, Any] = {"model": request.model or "", "stream": request.stream}
    if messages and messages[0]["role"] == "system":
        body["instructions"] = messages.pop(0)["content"]
    items: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m["tool_call_id"],
                    "output": m["content"],
                }
            )
        elif m["role"] == "assistant":
            if m.get("reasoning_content") is not None:
                items.append(
                    {
                        "type": "reasoning",
                        "summary": [{"type": "summary_text", "text": m["reasoning_content"]}],
                    }
                )
            if m.get("content") is not None:
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": m["content"]}],
                    }
                )
            for call in m.get("tool_calls") or []:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"],
                    }
                )
        else:
            items.append(
                {
                    "type": "message",
                    "role": m["role"],
                    "content": [{"type": "input_text", "text": m["content"]}],
                }
            )
    body["input"] = items
    if request.tools:
        body["tools"] = [{"type": "function", **t["function"]} for t in request.tools]
    for name, value in (
        ("temperature", request.sampling.temperature),
        ("top_p", request.sampling.top_p),
        ("max_output_tokens", request.sampling.max_tokens),
    ):
        if value is not None:
            body[name] = value
    return body


def input_tokens_json(num_tokens: int) -> dict[str, Any]:
    """The body of ``POST /v1/responses/input_tokens``: the prompt tokens a Responses
    request would send (``InputTokenCountResponse`` of the openai SDK).

    Args:
        num_tokens: prompt tokens, as the session would render them.
    """
    return {"object": "response.input_tokens", "input_tokens": num_tokens}


def error_body(error: RolloutdError) -> tuple[int, dict[str, Any]]:
    """The OpenAI error shape, as for Chat Completions."""
    return openai_chat.error_body(error)
