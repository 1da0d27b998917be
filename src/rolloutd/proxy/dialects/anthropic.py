"""Anthropic Messages (``POST /v1/messages``, ``/v1/messages/count_tokens``): translation and
stream events; the wire models, model objects and error body are
:mod:`rolloutd.proxy.dialects.anthropic_wire`, re-exported here, so this module is the dialect
the routes use.

References: Anthropic API reference, "Messages" https://docs.anthropic.com/en/api/messages ,
"Streaming Messages" https://docs.anthropic.com/en/docs/build-with-claude/streaming ,
"Errors" https://docs.anthropic.com/en/api/errors , "Count Message tokens"
https://docs.anthropic.com/en/api/messages-count-tokens .

Translation to OpenAI chat messages (the internal shape):

- ``system`` (a string or text blocks) -> a leading system message;
- user ``text`` blocks -> a user message; ``tool_result`` blocks -> tool messages (before the
  user text of the same message, as Claude Code sends them); ``image`` blocks are passed to the
  chat template, which refuses them (400) for a text-only model;
- assistant ``thinking`` -> ``reasoning_content``; ``text`` -> content; ``tool_use`` ->
  ``tool_calls`` (``input`` object -> ``arguments`` JSON string); ``redacted_thinking`` is
  dropped (opaque to any model but Claude).

Kept: ``max_tokens`` (required), ``temperature``, ``top_p``, ``stream``, ``tools``
(``input_schema`` -> ``parameters``). Ignored knowingly: ``top_k`` (the task decides),
``stop_sequences``, ``thinking``, ``metadata``, ``tool_choice``, ``cache_control``.

The request and the answer translate the same content blocks (an answer's blocks are what the
next request sends back), so both directions and the stream events stay in this one module.
"""

from __future__ import annotations

from typing import Any

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
from rolloutd.proxy.core.request_identity import RequestMemo, validate_new_items
from rolloutd.proxy.dialects.anthropic_wire import (
    CountTokensRequest,
    Message,
    MessagesRequest,
    error_body,
)
from rolloutd.proxy.dialects.anthropic_wire import model_json as model_json  # re-exported
from rolloutd.proxy.dialects.anthropic_wire import models_list as models_list
from rolloutd.proxy.dialects.common import (
    arguments_json,
    arguments_object,
    sse_named,
    validate,
)
from rolloutd.proxy.render.messages import content_text

DIALECT = "anthropic"
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_FINISH = {v: k for k, v in _STOP.items()}


# --------------------------------------------------------------------------- requests


def _block_text(block: dict[str, Any], where: str) -> str:
    if block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise RequestFieldError(f"a {block.get('type')!r} block is not supported here", param=where)
    return block["text"]


def _tool_result_text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        # image blocks reach content_text, which refuses them (400) for a text-only model
        return content_text(content)
    raise RequestFieldError("tool_result content must be a string or blocks", param=where)


def _user(message: Message, i: int) -> list[dict[str, Any]]:
    if isinstance(message.content, str):
        return [{"role": "user", "content": message.content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(message.content):
        kind = block.get("type")
        if kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise RequestFieldError(
                    "tool_result needs tool_use_id", param=f"messages.{i}.content.{j}.tool_use_id"
                )
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block["tool_use_id"],
                    "content": _tool_result_text(
                        block.get("content"), f"messages.{i}.content.{j}.content"
                    ),
                }
            )
        elif kind in ("text", "image", "document"):
            parts.append(block)
        else:
            raise RequestFieldError(
                f"a {kind!r} block is not supported in a user message",
                param=f"messages.{i}.content.{j}.type",
            )
    if parts:
        out.append({"role": "user", "content": content_text(parts)})
    return out


def _assistant(message: Message, i: int) -> dict[str, Any]:
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    texts, calls, reasoning = [], [], None
    for j, block in enumerate(message.content):
        kind = block.get("type")
        if kind == "text":
            texts.append(_block_text(block, f"messages.{i}.content.{j}"))
        elif kind == "thinking":
            reasoning = (reasoning or "") + str(block.get("thinking", ""))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise RequestFieldError(
                    "tool_use needs id and name", param=f"messages.{i}.content.{j}"
                )
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {
                        "name": block["name"],
                        "arguments": arguments_json(block.get("input", {})),
                    },
                }
            )
        else:
            raise RequestFieldError(
                f"a {kind!r} block is not supported in an assistant message",
                param=f"messages.{i}.content.{j}.type",
            )
    out: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts or not calls else None,
    }
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    if calls:
        out["tool_calls"] = calls
    return out


def _system(request: MessagesRequest) -> list[dict[str, Any]]:
    """The system message of ``request.system``, if any."""
    if isinstance(request.system, str) and request.system:
        return [{"role": "system", "content": request.system}]
    if isinstance(request.system, list) and request.system:
        return [
            {
                "role": "system",
                "content": "".join(
                    _block_text(b, f"system.{k}") for k, b in enumerate(request.system)
                ),
            }
        ]
    return []


def _conversation(wire_messages: list[Message], first: int) -> list[dict[str, Any]]:
    """The internal messages of ``wire_messages``, which stand at ``messages.{first}`` on."""
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(wire_messages, first):
        if message.role == "user":
            messages += _user(message, i)
        elif message.role == "system":
            if i == 0:
                raise RequestFieldError(
                    "messages.0.role: the first message must be 'user' or 'assistant'",
                    param="messages.0.role",
                )
            messages.append(
                {
                    "role": "system",
                    "content": message.content
                    if isinstance(message.content, str)
                    else "".join(
                        _block_text(b, f"messages.{i}.content.{k}")
                        for k, b in enumerate(message.content)
                    ),
                }
            )
        else:
            messages.append(_assistant(message, i))
    return messages


def to_internal(
    request: MessagesRequest, body: dict[str, Any], *, messages: list[dict[str, Any]] | None = None
) -> InternalRequest:
    """Translate a validated request (pure).

    Args:
        request: the validated wire request.
        body: the raw body (recorded and hashed as sent).
        messages: the translation of the system prompt and messages when the caller has it
            already (:func:`parse` with a memo); default: translated here.

    Raises:
        RequestFieldError: an unsupported block, or a tool_use/tool_result without its ids.
    """
    if messages is None:
        messages = [*_system(request), *_conversation(request.messages, 0)]
    tools = []
    for tool in request.tools or []:
        if tool.type not in (None, "custom"):
            continue  # server tools run at Anthropic; no backend here can run them
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = tool.input_schema or {"type": "object", "properties": {}}
        tools.append({"type": "function", "function": function})
    return InternalRequest(
        dialect=DIALECT,
        model=request.model,
        messages=messages,
        tools=tools,
        sampling=SamplingOverrides(
            temperature=request.temperature, top_p=request.top_p, max_tokens=request.max_tokens
        ),
        stream=request.stream,
        body=body,
    )


def parse(body: Any, *, memo: RequestMemo | None = None) -> InternalRequest:
    """Validate and translate a ``/v1/messages`` body.

    Pure without ``memo``. With the session's ``memo``, the messages the session's last call
    sent (the same JSON values, at the start of ``messages``, after the same ``system``) are
    not validated and translated again; the result is the one without ``memo`` (a call's cost
    must not grow with the conversation).
    """
    if memo is None:
        return to_internal(validate(MessagesRequest, body), body)
    raw = body.get("messages") if isinstance(body, dict) else None
    system = body.get("system") if isinstance(body, dict) else None
    known, known_messages, _ = memo.known_prefix(DIALECT, system, raw)
    wire: MessagesRequest | None = None
    if known:
        wire, start = validate_new_items(
            body, "messages", known, lambda cut: validate(MessagesRequest, cut)
        )
        if wire is not None:
            messages = [*known_messages, *_conversation(wire.messages[known - start :], known)]
    if wire is None:
        wire = validate(MessagesRequest, body)
        messages = [*_system(wire), *_conversation(wire.messages, 0)]
    request = to_internal(wire, body, messages=messages)
    memo.remember(DIALECT, system, raw, messages)
    return request


def parse_count_tokens(body: Any) -> InternalRequest:
    """Validate and translate a ``/v1/messages/count_tokens`` body (pure)."""
    return to_internal(validate(CountTokensRequest, body), body)


def request_from_internal(request: InternalRequest) -> dict[str, Any]:
    """The Messages body carrying ``request`` (inverse of :func:`parse`; property tests).

    Consecutive tool messages become one user message of ``tool_result`` blocks.
    """
    messages = list(request.messages)
    body: dict[str, Any] = {
        "model": request.model or "",
        "max_tokens": request.sampling.max_tokens or 1024,
        "stream": request.stream,
        "messages": [],
    }
    if messages and messages[0]["role"] == "system":
        body["system"] = messages.pop(0)["content"]
    out = body["messages"]
    for m in messages:
        if m["role"] == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": m["tool_call_id"],
                "content": m["content"],
            }
            if (
                out
                and out[-1]["role"] == "user"
                and out[-1]["content"]
                and out[-1]["content"][-1]["type"] == "tool_result"
            ):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif m["role"] in ("user", "system"):
            out.append({"role": m["role"], "content": [{"type": "text", "text": m["content"]}]})
        else:
            out.append(
                {
                    "role": "assistant",
                    "content": _assistant_blocks(
                        m.get("reasoning_content"), m.get("content"), m.get("tool_calls") or []
                    ),
                }
            )
    if request.tools:
        body["tools"] = [
            {
                "name": t["function"]["name"],
                **(
                    {"description": t["function"]["description"]}
                    if "description" in t["function"]
                    else {}
                ),
                "input_schema": t["function"].get("parameters", {}),
            }
            for t in request.tools
        ]
    if request.sampling.temperature is not None:
        body["temperature"] = request.sampling.temperature
    if request.sampling.top_p is not None:
        body["top_p"] = request.sampling.top_p
    return body


# --------------------------------------------------------------------------- responses


def _assistant_blocks(
    reasoning: str | None, content: str | None, tool_calls: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reasoning is not None:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if content or not tool_calls:
        blocks.append({"type": "text", "text": content or ""})
    blocks += [
        {
            "type": "tool_use",
            "id": c["id"],
            "name": c["function"]["name"],
            "input": arguments_object(c["function"]["arguments"]),
        }
        for c in tool_calls
    ]
    return blocks


def _msg_id(response_id: str) -> str:
    return f"msg_{id_suffix(response_id)}"


def response_json(
    response: InternalResponse, request: InternalRequest | None = None
) -> dict[str, Any]:
    """The ``message`` object of a non-streamed answer."""
    return {
        "id": _msg_id(response.id),
        "type": "message",
        "role": "assistant",
        "model": response.model,
        "content": _assistant_blocks(response.reasoning, response.content, response.tool_calls),
        "stop_reason": _STOP[response.finish_reason],
        "stop_sequence": None,
        "usage": {
            "input_tokens": response.usage.prompt_tokens,
            "output_tokens": response.usage.completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def response_to_internal(body: dict[str, Any]) -> InternalResponse:
    """A ``message`` object back to the internal answer (round-trip tests)."""
    assistant = _assistant(Message(role="assistant", content=body["content"]), 0)
    return InternalResponse(
        id=body["id"],
        created=0,
        model=body["model"],
        text=assistant["content"] or "",
        content=assistant["content"],
        reasoning=assistant.get("reasoning_content"),
        tool_calls=assistant.get("tool_calls", []),
        finish_reason=_FINISH[body["stop_reason"]],  # type: ignore[arg-type]
        usage=Usage(
            prompt_tokens=body["usage"]["input_tokens"],
            completion_tokens=body["usage"]["output_tokens"],
        ),
    )


# --------------------------------------------------------------------------- streaming


class Encoder:
    """The Messages event sequence of one answer::

    message_start, ping,
    [thinking block: content_block_start, thinking_delta..., signature_delta,
     content_block_stop]
    [text block: content_block_start, text_delta..., content_block_stop]
    [per tool_use: content_block_start, input_json_delta, content_block_stop]
    message_delta (stop_reason, usage.output_tokens), message_stop
    """

    def __init__(self, start: StreamStart, request: InternalRequest) -> None:
        self.start = start
        self.index = -1
        self.open: str | None = None  # "thinking" | "text"

    def _block_start(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self._block_stop()
        self.index += 1
        self.open = kind
        out.append(
            sse_named(
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        return out

    def _block_stop(self) -> list[bytes]:
        out = []
        if self.open == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": ""}))
        if self.open is not None:
            out.append(
                sse_named("content_block_stop", {"type": "content_block_stop", "index": self.index})
            )
        self.open = None
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_named(
            "content_block_delta",
            {"type": "content_block_delta", "index": self.index, "delta": delta},
        )

    def _text(self, kind: str, text: str) -> list[bytes]:
        out = []
        if self.open != kind:
            block = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            out += self._block_start(kind, block)
        if text:
            out.append(
                self._delta(
                    {"type": "thinking_delta", "thinking": text}
                    if kind == "thinking"
                    else {"type": "text_delta", "text": text}
                )
            )
        return out

    def encode(self, event: StreamEvent) -> list[bytes]:
        """Events for one internal stream event."""
        if isinstance(event, StreamStart):
            message = {
                "id": _msg_id(self.start.id),
                "type": "message",
                "role": "assistant",
                "model": self.start.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                # the prompt's tokens when known now (Anthropic streams them here)
                "usage": {"input_tokens": event.prompt_tokens or 0, "output_tokens": 0},
            }
            return [
                sse_named("message_start", {"type": "message_start", "message": message}),
                sse_named("ping", {"type": "ping"}),
            ]
        if isinstance(event, StreamReasoning):
            return self._text("thinking", event.text) if event.text else []
        if isinstance(event, StreamContent):
            return self._text("text", event.text) if event.text else []
        return self._end(event)

    def _end(self, event: StreamEnd) -> list[bytes]:
        response = event.response
        out = []
        if event.reasoning_tail or (response.reasoning is not None and self.index < 0):
            out += self._text("thinking", event.reasoning_tail)
        if event.content_tail or (
            (response.content or not response.tool_calls) and self.open != "text"
        ):
            out += self._text("text", event.content_tail)
        out += self._block_stop()
        for call in response.tool_calls:
            out += self._block_start(
                "tool_use",
                {
                    "type": "tool_use",
                    "id": call["id"],
                    "name": call["function"]["name"],
                    "input": {},
                },
            )
            out.append(
                self._delta(
                    {"type": "input_json_delta", "partial_json": call["function"]["arguments"]}
                )
            )
            out += self._block_stop()
        out.append(
            sse_named(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": _STOP[response.finish_reason], "stop_sequence": None},
                    "usage": {
                        "input_tokens": response.usage.prompt_tokens,
                        "output_tokens": response.usage.completion_tokens,
                    },
                },
            )
        )
        out.append(sse_named("message_stop", {"type": "message_stop"}))
        return out

    def close(self) -> list[bytes]:
        """Nothing: ``message_stop`` ends the stream."""
        return []

    def error(self, error: RolloutdError) -> list[bytes]:
        """An ``error`` event in the Anthropic error shape."""
        return [sse_named("error", error_body(error)[1])]


def encoder(start: StreamStart, request: InternalRequest) -> Encoder:
    """The stream encoder of one answer."""
    return Encoder(start, request)


def collect_stream(events: list[dict[str, Any]]) -> InternalResponse:
    """Rebuild an answer from its parsed stream events (tests)."""
    message: dict[str, Any] = {}
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for event in events:
        kind = event["type"]
        if kind == "message_start":
            message = dict(event["message"])
        elif kind == "content_block_start":
            blocks.append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            delta, block = event["delta"], blocks[event["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif kind == "message_delta":
            message["stop_reason"] = event["delta"]["stop_reason"]
            message["usage"] = event["usage"]
    for index, text in partial.items():
        blocks[index]["input"] = arguments_object(text)
    return response_to_internal({**message, "content": blocks})
