"""OpenAI Responses (``POST /v1/responses``): wire models, translation, stream events, errors.

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
    InternalResponse,
    SamplingOverrides,
    StreamContent,
    StreamEnd,
    StreamEvent,
    StreamReasoning,
    StreamStart,
    Usage,
    id_suffix,
)
from rolloutd.proxy.dialects import openai_chat
from rolloutd.proxy.dialects.common import sse_named, validate
from rolloutd.proxy.render.messages import content_text
from rolloutd.proxy.sessions.request_identity import RequestMemo, validate_new_items

log = structlog.get_logger(__name__)

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


# --------------------------------------------------------------------------- responses


def _ids(response_id: str) -> tuple[str, str, str]:
    suffix = id_suffix(response_id)
    return f"resp_{suffix}", f"msg_{suffix}", f"rs_{suffix}"


def wire_id(response: InternalResponse) -> str:
    """The ``resp_...`` id of an answer (stable: derived from the session and index)."""
    return _ids(response.id)[0]


def _reasoning_item(rs_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": rs_id, "summary": [{"type": "summary_text", "text": text}]}


def _message_item(msg_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": msg_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call_item(response_id: str, i: int, call: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{id_suffix(response_id)}_{i}",
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": "completed",
    }


def _has_message(response: InternalResponse) -> bool:
    return bool(response.content) or not response.tool_calls


def output_items(response: InternalResponse) -> list[dict[str, Any]]:
    """The ``output`` items of an answer: reasoning, message, function calls, in that order.

    A message item is present when there is content, or when there is nothing else.
    """
    _, msg_id, rs_id = _ids(response.id)
    items = []
    if response.reasoning is not None:
        items.append(_reasoning_item(rs_id, response.reasoning))
    if _has_message(response):
        items.append(_message_item(msg_id, response.content or ""))
    items += [_call_item(response.id, i, c) for i, c in enumerate(response.tool_calls)]
    return items


def _response_object(
    response: InternalResponse | None,
    start: StreamStart,
    request: InternalRequest,
    *,
    status: str,
    output: list[dict[str, Any]],
) -> dict[str, Any]:
    body = request.body
    usage = None
    if response is not None:
        usage = {
            "input_tokens": response.usage.prompt_tokens,
            # the SDK's types require both counts (openai 3.57, strict validation)
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": response.usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": response.usage.total_tokens,
        }
    return {
        "id": _ids(start.id)[0],
        "object": "response",
        "created_at": start.created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": start.model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "store": False,
        "text": {"format": {"type": "text"}},
        "usage": usage,
        "metadata": {},
    }


def response_json(response: InternalResponse, request: InternalRequest) -> dict[str, Any]:
    """The ``response`` object of a non-streamed answer (status ``incomplete`` when cut by
    ``max_output_tokens``)."""
    start = StreamStart(id=response.id, created=response.created, model=response.model)
    status = "incomplete" if response.finish_reason == "length" else "completed"
    return _response_object(response, start, request, status=status, output=output_items(response))


def response_to_internal(body: dict[str, Any]) -> InternalResponse:
    """A ``response`` object back to the internal answer (round-trip tests)."""
    content, reasoning, calls = None, None, []
    for item in body["output"]:
        if item["type"] == "message":
            content = "".join(p["text"] for p in item["content"])
        elif item["type"] == "reasoning":
            reasoning = "".join(p["text"] for p in item["summary"])
        elif item["type"] == "function_call":
            calls.append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                }
            )
    if body["status"] == "incomplete":
        finish = "length"
    else:
        finish = "tool_calls" if calls else "stop"
    usage = body["usage"]
    return InternalResponse(
        id=body["id"],
        created=body["created_at"],
        model=body["model"],
        text=content or "",
        content=content if content or not calls else None,
        reasoning=reasoning,
        tool_calls=calls,
        finish_reason=finish,  # type: ignore[arg-type]
        usage=Usage(prompt_tokens=usage["input_tokens"], completion_tokens=usage["output_tokens"]),
    )


# --------------------------------------------------------------------------- streaming


class Encoder:
    """The Responses event sequence of one answer (each event with its ``sequence_number``)::

    response.created, response.in_progress,
    [reasoning: output_item.added, reasoning_summary_part.added,
     reasoning_summary_text.delta..., reasoning_summary_text.done,
     reasoning_summary_part.done, output_item.done]
    [message: output_item.added, content_part.added, output_text.delta...,
     output_text.done, content_part.done, output_item.done]
    [per call: output_item.added, function_call_arguments.delta,
     function_call_arguments.done, output_item.done]
    response.completed | response.incomplete
    """

    def __init__(self, start: StreamStart, request: InternalRequest) -> None:
        self.start = start
        self.request = request
        self.resp_id, self.msg_id, self.rs_id = _ids(start.id)
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: str | None = None  # "reasoning" | "message"
        self.text = ""

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse_named(kind, payload)

    def _close(self) -> list[bytes]:
        out = []
        index = len(self.output)
        if self.open == "reasoning":
            part = {"type": "summary_text", "text": self.text}
            common = {"item_id": self.rs_id, "output_index": index, "summary_index": 0}
            item = _reasoning_item(self.rs_id, self.text)
            out += [
                self._event("response.reasoning_summary_text.done", text=self.text, **common),
                self._event("response.reasoning_summary_part.done", part=part, **common),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
            self.output.append(item)
        elif self.open == "message":
            part = {"type": "output_text", "text": self.text, "annotations": []}
            common = {"item_id": self.msg_id, "output_index": index, "content_index": 0}
            item = _message_item(self.msg_id, self.text)
            # logprobs is required on the done event as on each delta (the SDK's types)
            out += [
                self._event("response.output_text.done", text=self.text, logprobs=[], **common),
                self._event("response.content_part.done", part=part, **common),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
            self.output.append(item)
        self.open, self.text = None, ""
        return out

    def _delta(self, kind: str, text: str) -> list[bytes]:
        out = []
        index = len(self.output)
        if self.open != kind:
            out += self._close()
            self.open = kind
            if kind == "reasoning":
                item = {"type": "reasoning", "id": self.rs_id, "summary": []}
                out += [
                    self._event("response.output_item.added", output_index=index, item=item),
                    self._event(
                        "response.reasoning_summary_part.added",
                        item_id=self.rs_id,
                        output_index=index,
                        summary_index=0,
                        part={"type": "summary_text", "text": ""},
                    ),
                ]
            else:
                item = {**_message_item(self.msg_id, "", "in_progress"), "content": []}
                out += [
                    self._event("response.output_item.added", output_index=index, item=item),
                    self._event(
                        "response.content_part.added",
                        item_id=self.msg_id,
                        output_index=index,
                        content_index=0,
                        part={"type": "output_text", "text": "", "annotations": []},
                    ),
                ]
        if text:
            self.text += text
            if kind == "reasoning":
                out.append(
                    self._event(
                        "response.reasoning_summary_text.delta",
                        item_id=self.rs_id,
                        output_index=index,
                        summary_index=0,
                        delta=text,
                    )
                )
            else:
                out.append(
                    self._event(
                        "response.output_text.delta",
                        item_id=self.msg_id,
                        output_index=index,
                        content_index=0,
                        delta=text,
                        logprobs=[],
                    )
                )
        return out

    def encode(self, event: StreamEvent) -> list[bytes]:
        """Events for one internal stream event."""
        if isinstance(event, StreamStart):
            created = _response_object(
                None, self.start, self.request, status="in_progress", output=[]
            )
            return [
                self._event("response.created", response=created),
                self._event("response.in_progress", response=created),
            ]
        if isinstance(event, StreamReasoning):
            return self._delta("reasoning", event.text) if event.text else []
        if isinstance(event, StreamContent):
            return self._delta("message", event.text) if event.text else []
        return self._end(event)

    def _end(self, event: StreamEnd) -> list[bytes]:
        response = event.response
        out = []
        if event.reasoning_tail or (
            response.reasoning is not None and self.open != "reasoning" and not self.output
        ):
            out += self._delta("reasoning", event.reasoning_tail)
        if event.content_tail or (_has_message(response) and self.open != "message"):
            out += self._delta("message", event.content_tail)
        out += self._close()
        for i, call in enumerate(response.tool_calls):
            index = len(self.output)
            item = _call_item(response.id, i, call)
            out += [
                self._event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                ),
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=item["arguments"],
                ),
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                ),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
            self.output.append(item)
        status = "incomplete" if response.finish_reason == "length" else "completed"
        final = _response_object(
            response, self.start, self.request, status=status, output=self.output
        )
        out.append(self._event(f"response.{status}", response=final))
        return out

    def close(self) -> list[bytes]:
        """Nothing: the Responses stream ends with its terminal event, no ``[DONE]``."""
        return []

    def error(self, error: RolloutdError) -> list[bytes]:
        """``error`` then ``response.failed`` (with ``response.error``)."""
        _, body = error_body(error)
        failed = _response_object(
            None, self.start, self.request, status="failed", output=self.output
        )
        failed["error"] = {
            "code": _failed_code(error.status_code),
            "message": error.message,
            "param": body["error"]["param"],
            "type": body["error"]["type"],
        }
        return [
            self._event(
                "error",
                code=body["error"]["code"],
                message=error.message,
                param=body["error"]["param"],
            ),
            self._event("response.failed", response=failed),
        ]


def _failed_code(status: int) -> str:
    """The ``response.error.code`` of a failed Responses answer: one of the codes the API
    enumerates (``ResponseError.code`` of the openai SDK; a strict client rejects any other),
    chosen by HTTP status. The ``error`` event before it carries the gateway's own code."""
    if status == 429:
        return "rate_limit_exceeded"
    return "invalid_prompt" if 400 <= status < 500 else "server_error"


def encoder(start: StreamStart, request: InternalRequest) -> Encoder:
    """The stream encoder of one answer."""
    return Encoder(start, request)


def collect_stream(events: list[dict[str, Any]]) -> InternalResponse:
    """Rebuild an answer from its parsed stream events (deltas and finished call items).

    The terminal event gives id, usage and status; content and reasoning are the
    concatenated deltas.
    """
    text = reasoning = ""
    saw_message = saw_reasoning = False
    calls = []
    final: dict[str, Any] = {}
    for event in events:
        kind = event["type"]
        if kind == "response.output_text.delta":
            text += event["delta"]
        elif kind == "response.reasoning_summary_text.delta":
            reasoning += event["delta"]
        elif kind == "response.output_item.added":
            saw_message |= event["item"]["type"] == "message"
            saw_reasoning |= event["item"]["type"] == "reasoning"
        elif kind == "response.output_item.done" and event["item"]["type"] == "function_call":
            item = event["item"]
            calls.append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                }
            )
        elif kind in ("response.completed", "response.incomplete"):
            final = event["response"]
    body = {**final, "output": []}
    if saw_reasoning:
        body["output"].append(_reasoning_item("rs", reasoning))
    if saw_message:
        body["output"].append(_message_item("msg", text))
    body["output"] += [
        {"type": "function_call", "call_id": c["id"], **c["function"]} for c in calls
    ]
    return response_to_internal(body)


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
