"""Gemini ``models/{model}:generateContent`` / ``:streamGenerateContent`` / ``:countTokens``:
translation and stream chunks; the wire models, ``Model`` resources and error body are
:mod:`rolloutd.proxy.dialects.gemini_wire`, re-exported here, so this module is the dialect the
routes use.

References: Gemini API reference, "Generating content"
https://ai.google.dev/api/generate-content (request, ``GenerateContentResponse``,
``streamGenerateContent`` with ``alt=sse``), "Function calling"
https://ai.google.dev/gemini-api/docs/function-calling , "Counting tokens"
https://ai.google.dev/api/tokens , errors https://ai.google.dev/gemini-api/docs/troubleshooting
(``{"error": {"code", "message", "status"}}``).

Translation to OpenAI chat messages (the internal shape):

- ``systemInstruction`` (or ``system_instruction``) parts -> a leading system message;
- ``user`` contents: ``text`` parts -> a user message; ``functionResponse`` parts -> tool
  messages (before the text), ``response.output`` as the content (other objects as JSON);
- ``model`` contents: ``text`` parts -> content, ``thought: true`` parts -> reasoning,
  ``functionCall`` -> ``tool_calls`` (``args`` object -> ``arguments`` JSON). A call without
  ``id`` gets ``call_{content index}_{part index}``; a response without ``id`` answers the
  earliest unanswered call of its name.

Kept: ``generationConfig.temperature/topP/maxOutputTokens``, ``tools[].functionDeclarations``
(``parameters`` or ``parametersJsonSchema``). ``candidateCount`` other than 1 is refused.
Ignored knowingly: ``safetySettings``, ``toolConfig``, ``thinkingConfig``, ``topK``,
``stopSequences``, ``cachedContent``. Both camelCase and snake_case field names are accepted,
as the REST API's JSON mapping does.

The request and the answer translate the same parts (an answer's parts are what the next
request sends back), so both directions and the stream chunks stay in this one module.
"""

from __future__ import annotations

import json
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
from rolloutd.proxy.dialects.common import (
    arguments_json,
    arguments_object,
    sse_data,
    validate,
)
from rolloutd.proxy.dialects.gemini_wire import (
    Content,
    GenerateContentRequest,
    GenerationConfig,
    camel_keys,
    error_body,
)
from rolloutd.proxy.dialects.gemini_wire import model_json as model_json  # re-exported
from rolloutd.proxy.dialects.gemini_wire import models_list as models_list
from rolloutd.proxy.render.messages import content_text

DIALECT = "gemini"
_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP"}


# --------------------------------------------------------------------------- requests


def _response_text(response: Any) -> str:
    if (
        isinstance(response, dict)
        and set(response) == {"output"}
        and isinstance(response["output"], str)
    ):
        return response["output"]
    return json.dumps(response, ensure_ascii=False)


def _user(
    content: Content, i: int, messages: list[dict[str, Any]], pending: list[dict[str, Any]]
) -> None:
    texts: list[dict[str, Any]] = []
    for j, part in enumerate(content.parts):
        if "functionResponse" in part:
            fr = part["functionResponse"]
            if not isinstance(fr, dict) or not isinstance(fr.get("name"), str):
                raise RequestFieldError(
                    "functionResponse needs a name",
                    param=f"contents.{i}.parts.{j}.functionResponse",
                )
            call_id = fr.get("id")
            match = next(
                (
                    c
                    for c in pending
                    if (c["id"] == call_id if call_id else c["function"]["name"] == fr["name"])
                ),
                None,
            )
            if match is not None:
                pending.remove(match)
            call_id = call_id or (match["id"] if match else f"call_{fr['name']}")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "name": fr["name"],
                    "content": _response_text(fr.get("response", {})),
                }
            )
        elif "text" in part:
            texts.append({"type": "text", "text": str(part["text"])})
        elif "inlineData" in part or "fileData" in part:
            texts.append({"type": "image", **part})  # refused (400) by the text-only template
        else:
            raise RequestFieldError(
                "this part is not supported in a user content", param=f"contents.{i}.parts.{j}"
            )
    if texts:
        messages.append({"role": "user", "content": content_text(texts)})


def _model(content: Content, i: int) -> dict[str, Any]:
    text, reasoning, calls = [], None, []
    for j, part in enumerate(content.parts):
        if "functionCall" in part:
            fc = part["functionCall"]
            if not isinstance(fc, dict) or not isinstance(fc.get("name"), str):
                raise RequestFieldError(
                    "functionCall needs a name", param=f"contents.{i}.parts.{j}.functionCall"
                )
            calls.append(
                {
                    "id": fc.get("id") or f"call_{i}_{j}",
                    "type": "function",
                    "function": {
                        "name": fc["name"],
                        "arguments": arguments_json(fc.get("args", {})),
                    },
                }
            )
        elif "text" in part and part.get("thought"):
            reasoning = (reasoning or "") + str(part["text"])
        elif "text" in part:
            text.append(str(part["text"]))
        elif set(part) <= {"thoughtSignature"}:
            continue
        else:
            raise RequestFieldError(
                "this part is not supported in a model content", param=f"contents.{i}.parts.{j}"
            )
    out: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(text) if text or not calls else None,
    }
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    if calls:
        out["tool_calls"] = calls
    return out


def _tools(raw: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    tools = []
    for group in raw or []:
        for decl in group.get("functionDeclarations") or []:
            if not isinstance(decl, dict) or not isinstance(decl.get("name"), str):
                raise RequestFieldError(
                    "a function declaration needs a name", param="tools.functionDeclarations"
                )
            function: dict[str, Any] = {"name": decl["name"]}
            if decl.get("description") is not None:
                function["description"] = decl["description"]
            schema = decl.get("parametersJsonSchema", decl.get("parameters"))
            if schema is not None:
                function["parameters"] = schema
            tools.append({"type": "function", "function": function})
    return tools  # googleSearch, codeExecution, ...: hosted tools, dropped


def _system(request: GenerateContentRequest) -> list[dict[str, Any]]:
    """The system message of ``systemInstruction``, if any."""
    if request.systemInstruction and request.systemInstruction.parts:
        return [
            {
                "role": "system",
                "content": "".join(str(p.get("text", "")) for p in request.systemInstruction.parts),
            }
        ]
    return []


def _translate_contents(
    contents: list[Content],
    first: int,
    messages: list[dict[str, Any]],
    pending: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Append the messages of ``contents`` (standing at ``contents.{first}`` on) to
    ``messages``.

    Args:
        pending: the tool calls of the last model turn not answered yet (what a
            ``functionResponse`` without an id is matched against).

    Returns:
        The calls still pending after ``contents``.
    """
    for i, content in enumerate(contents, first):
        if content.role == "model":
            message = _model(content, i)
            pending = list(message.get("tool_calls", []))
            messages.append(message)
        else:
            _user(content, i, messages, pending)
    return pending


def to_internal(
    request: GenerateContentRequest,
    body: dict[str, Any],
    *,
    model: str | None,
    stream: bool,
    messages: list[dict[str, Any]] | None = None,
) -> InternalRequest:
    """Translate a validated request (pure).

    Args:
        request: the validated wire request.
        body: the raw body (recorded and hashed).
        model: the model from the URL path.
        stream: ``streamGenerateContent`` was called.
        messages: the translation of the system instruction and contents when the caller has
            it already (:func:`parse` with a memo); default: translated here.

    Raises:
        RequestFieldError: an unsupported part, or a call/response without a name.
    """
    if messages is None:
        messages = _system(request)
        _translate_contents(request.contents, 0, messages, [])
    config = request.generationConfig or GenerationConfig()
    return InternalRequest(
        dialect=DIALECT,
        model=model,
        messages=messages,
        tools=_tools(request.tools),
        sampling=SamplingOverrides(
            temperature=config.temperature, top_p=config.topP, max_tokens=config.maxOutputTokens
        ),
        stream=stream,
        body=body,
    )


def _validate(body: Any) -> GenerateContentRequest:
    return validate(GenerateContentRequest, camel_keys(body) if isinstance(body, dict) else body)


def parse(
    body: Any, *, model: str | None = None, stream: bool = False, memo: RequestMemo | None = None
) -> InternalRequest:
    """Validate and translate a body; see :func:`to_internal`.

    Pure without ``memo``. With the session's ``memo``, the contents the session's last call
    sent (the same JSON values, at the start of ``contents``, after the same system
    instruction) are not validated and translated again; the result is the one without
    ``memo`` (a call's cost must not grow with the conversation).
    """
    if memo is None:
        return to_internal(_validate(body), body, model=model, stream=stream)
    raw = body.get("contents") if isinstance(body, dict) else None
    # both spellings of the system instruction, in the body's order: with both present, the
    # order decides which one validation keeps
    context = (
        [(k, v) for k, v in body.items() if k in ("systemInstruction", "system_instruction")]
        if isinstance(body, dict)
        else None
    )
    known, known_messages, known_pending = memo.known_prefix(DIALECT, context, raw)
    wire: GenerateContentRequest | None = None
    if known:
        wire, start = validate_new_items(body, "contents", known, _validate)
        if wire is not None:
            messages = list(known_messages)
            pending = _translate_contents(
                wire.contents[known - start :], known, messages, list(known_pending)
            )
    if wire is None:
        wire = _validate(body)
        messages = _system(wire)
        pending = _translate_contents(wire.contents, 0, messages, [])
    request = to_internal(wire, body, model=model, stream=stream, messages=messages)
    memo.remember(DIALECT, context, raw, messages, state=list(pending))
    return request


def parse_count_tokens(body: Any, *, model: str | None = None) -> InternalRequest:
    """A ``countTokens`` body: ``{"contents": ...}`` or ``{"generateContentRequest": ...}``."""
    if isinstance(body, dict) and isinstance(body.get("generateContentRequest"), dict):
        body = body["generateContentRequest"]
    return parse(body, model=model)


def request_from_internal(request: InternalRequest) -> dict[str, Any]:
    """The generateContent body carrying ``request`` (inverse of :func:`parse`; tests)."""
    messages = list(request.messages)
    body: dict[str, Any] = {"contents": []}
    if messages and messages[0]["role"] == "system":
        body["systemInstruction"] = {"parts": [{"text": messages.pop(0)["content"]}]}
    contents = body["contents"]
    for m in messages:
        if m["role"] == "tool":
            part = {
                "functionResponse": {
                    "id": m["tool_call_id"],
                    "name": m.get("name", ""),
                    "response": {"output": m["content"]},
                }
            }
            if (
                contents
                and contents[-1]["role"] == "user"
                and "functionResponse" in contents[-1]["parts"][-1]
            ):
                contents[-1]["parts"].append(part)
            else:
                contents.append({"role": "user", "parts": [part]})
        elif m["role"] == "user":
            contents.append({"role": "user", "parts": [{"text": m["content"]}]})
        else:
            contents.append(
                {
                    "role": "model",
                    "parts": _model_parts(
                        m.get("reasoning_content"), m.get("content"), m.get("tool_calls") or []
                    ),
                }
            )
    if request.tools:
        body["tools"] = [{"functionDeclarations": [t["function"] for t in request.tools]}]
    config = {}
    for name, value in (
        ("temperature", request.sampling.temperature),
        ("topP", request.sampling.top_p),
        ("maxOutputTokens", request.sampling.max_tokens),
    ):
        if value is not None:
            config[name] = value
    if config:
        body["generationConfig"] = config
    return body


# --------------------------------------------------------------------------- responses


def _model_parts(
    reasoning: str | None, content: str | None, tool_calls: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if reasoning is not None:
        parts.append({"text": reasoning, "thought": True})
    if content or not tool_calls:
        parts.append({"text": content or ""})
    parts += [
        {
            "functionCall": {
                "id": c["id"],
                "name": c["function"]["name"],
                "args": arguments_object(c["function"]["arguments"]),
            }
        }
        for c in tool_calls
    ]
    return parts


def _usage(response: InternalResponse) -> dict[str, int]:
    return {
        "promptTokenCount": response.usage.prompt_tokens,
        "candidatesTokenCount": response.usage.completion_tokens,
        "totalTokenCount": response.usage.total_tokens,
    }


def _chunk(
    start: StreamStart,
    parts: list[dict[str, Any]],
    *,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    chunk: dict[str, Any] = {
        "candidates": [candidate],
        "modelVersion": start.model,
        "responseId": id_suffix(start.id),
    }
    if usage is not None:
        chunk["usageMetadata"] = usage
    return chunk


def response_json(
    response: InternalResponse, request: InternalRequest | None = None
) -> dict[str, Any]:
    """The ``GenerateContentResponse`` of a non-streamed answer."""
    start = StreamStart(id=response.id, created=response.created, model=response.model)
    return _chunk(
        start,
        _model_parts(response.reasoning, response.content, response.tool_calls),
        finish=_FINISH[response.finish_reason],
        usage=_usage(response),
    )


def response_to_internal(body: dict[str, Any]) -> InternalResponse:
    """A ``GenerateContentResponse`` back to the internal answer (round-trip tests)."""
    candidate = body["candidates"][0]
    message = _model(Content(role="model", parts=candidate["content"]["parts"]), 0)
    calls = message.get("tool_calls", [])
    finish = (
        "length"
        if candidate["finishReason"] == "MAX_TOKENS"
        else ("tool_calls" if calls else "stop")
    )
    usage = body["usageMetadata"]
    return InternalResponse(
        id=body["responseId"],
        created=0,
        model=body["modelVersion"],
        text=message["content"] or "",
        content=message["content"],
        reasoning=message.get("reasoning_content"),
        tool_calls=calls,
        finish_reason=finish,  # type: ignore[arg-type]
        usage=Usage(
            prompt_tokens=usage["promptTokenCount"], completion_tokens=usage["candidatesTokenCount"]
        ),
    )


class Encoder:
    """``streamGenerateContent`` chunks: one ``GenerateContentResponse`` per text delta
    (``thought: true`` parts for reasoning), the last with the function calls,
    ``finishReason`` and ``usageMetadata``.

    Args:
        sse: ``alt=sse`` framing (``data: {json}``); otherwise a JSON array streamed
            element by element, as the REST API does without ``alt=sse``.
    """

    def __init__(self, start: StreamStart, request: InternalRequest, *, sse: bool = True) -> None:
        self.start = start
        self.sse = sse
        self.num_sent = 0

    def _frame(self, chunk: dict[str, Any]) -> bytes:
        if self.sse:
            return sse_data(chunk)
        lead = "[" if self.num_sent == 0 else ",\r\n"
        self.num_sent += 1
        return (lead + json.dumps(chunk, ensure_ascii=False)).encode()

    def encode(self, event: StreamEvent) -> list[bytes]:
        """Chunks for one internal stream event (nothing for the start)."""
        if isinstance(event, StreamStart):
            return []
        if isinstance(event, StreamReasoning):
            return (
                [self._frame(_chunk(self.start, [{"text": event.text, "thought": True}]))]
                if event.text
                else []
            )
        if isinstance(event, StreamContent):
            return [self._frame(_chunk(self.start, [{"text": event.text}]))] if event.text else []
        return self._end(event)

    def _end(self, event: StreamEnd) -> list[bytes]:
        response = event.response
        parts: list[dict[str, Any]] = []
        if event.reasoning_tail:
            parts.append({"text": event.reasoning_tail, "thought": True})
        if event.content_tail:
            parts.append({"text": event.content_tail})
        parts += _model_parts(None, None, response.tool_calls)[0 if response.tool_calls else 1 :]
        return [
            self._frame(
                _chunk(
                    self.start,
                    parts,
                    finish=_FINISH[response.finish_reason],
                    usage=_usage(response),
                )
            )
        ]

    def close(self) -> list[bytes]:
        """``]`` closing the JSON array (nothing with ``alt=sse``)."""
        if self.sse:
            return []
        return [b"[]" if self.num_sent == 0 else b"]"]

    def error(self, error: RolloutdError) -> list[bytes]:
        """A Gemini error object as the last chunk."""
        return [self._frame(error_body(error)[1])]


def encoder(start: StreamStart, request: InternalRequest, *, sse: bool = True) -> Encoder:
    """The stream encoder of one answer."""
    return Encoder(start, request, sse=sse)


def collect_stream(chunks: list[dict[str, Any]]) -> InternalResponse:
    """Rebuild an answer from its parsed chunks (tests): parts concatenated in order."""
    parts: list[dict[str, Any]] = []
    for chunk in chunks:
        for part in chunk["candidates"][0]["content"]["parts"]:
            last = parts[-1] if parts else None
            if (
                last is not None
                and "text" in part
                and "text" in last
                and bool(part.get("thought")) == bool(last.get("thought"))
            ):
                last["text"] += part["text"]
            else:
                parts.append(dict(part))
    last_chunk = chunks[-1]
    candidate = {**last_chunk["candidates"][0], "content": {"role": "model", "parts": parts}}
    return response_to_internal({**last_chunk, "candidates": [candidate]})
