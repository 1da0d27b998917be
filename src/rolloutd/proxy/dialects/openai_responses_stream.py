"""OpenAI Responses streaming: the event sequence of one answer, and an answer rebuilt from
its events (round-trip tests).

Reference: OpenAI API reference, "Streaming events"
https://platform.openai.com/docs/api-reference/responses-streaming
"""

from __future__ import annotations

from typing import Any

from rolloutd.errors import RolloutdError
from rolloutd.proxy.core.call_types import (
    InternalRequest,
    InternalResponse,
    StreamContent,
    StreamEnd,
    StreamEvent,
    StreamReasoning,
    StreamStart,
)
from rolloutd.proxy.dialects import openai_chat
from rolloutd.proxy.dialects.common import sse_named
from rolloutd.proxy.dialects.openai_responses_output import (
    answer_ids,
    call_item,
    has_message,
    message_item,
    reasoning_item,
    response_object,
    response_to_internal,
)


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
        self.resp_id, self.msg_id, self.rs_id = answer_ids(start.id)
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
            item = reasoning_item(self.rs_id, self.text)
            out += [
                self._event("response.reasoning_summary_text.done", text=self.text, **common),
                self._event("response.reasoning_summary_part.done", part=part, **common),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
            self.output.append(item)
        elif self.open == "message":
            part = {"type": "output_text", "text": self.text, "annotations": []}
            common = {"item_id": self.msg_id, "output_index": index, "content_index": 0}
            item = message_item(self.msg_id, self.text)
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
                item = {**message_item(self.msg_id, "", "in_progress"), "content": []}
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
            created = response_object(
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
        if event.content_tail or (has_message(response) and self.open != "message"):
            out += self._delta("message", event.content_tail)
        out += self._close()
        for i, call in enumerate(response.tool_calls):
            index = len(self.output)
            item = call_item(response.id, i, call)
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
        final = response_object(
            response, self.start, self.request, status=status, output=self.output
        )
        out.append(self._event(f"response.{status}", response=final))
        return out

    def close(self) -> list[bytes]:
        """Nothing: the Responses stream ends with its terminal event, no ``[DONE]``."""
        return []

    def error(self, error: RolloutdError) -> list[bytes]:
        """``error`` then ``response.failed`` (with ``response.error``)."""
        _, body = openai_chat.error_body(error)
        failed = response_object(
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
        body["output"].append(reasoning_item("rs", reasoning))
    if saw_message:
        body["output"].append(message_item("msg", text))
    body["output"] += [
        {"type": "function_call", "call_id": c["id"], **c["function"]} for c in calls
    ]
    return response_to_internal(body)
