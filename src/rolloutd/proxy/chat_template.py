"""Chat templates and the session's token chain (DESIGN.md, Gateway, ``tokens`` capture mode).

The gateway renders prompts with the model's own tokenizer chat template (Hugging Face
``apply_chat_template(..., tools=..., add_generation_prompt=True, tokenize=False)``) and
tokenizes the text with ``add_special_tokens=False`` (the template writes every special token
itself).

The token chain: when a request continues an earlier completion's conversation (the same earlier
messages, the assistant answer that completion returned, then new messages), the next prompt is::

    prompt_ids(c) + response_ids(c) [+ end_of_turn_id when not sampled]
        + tokens(trailer + text the template renders after that assistant turn)

where ``trailer`` is what the template writes after the end-of-turn token of an assistant turn
(``"\\n"`` after ``<|im_end|>`` for Qwen). The model thus sees exactly the tokens it sampled,
and a trace built from the log is exact by construction (no re-tokenisation drift).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
import structlog

from rolloutd.errors import ConfigError, InvalidRequestError
from rolloutd.types import Completion

log = structlog.get_logger(__name__)

_PROBE_USER = "ping"
_PROBE_ANSWER = "rolloutd-probe-answer"


# --------------------------------------------------------------------------- messages


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
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text",
                                                                 "output_text"):
                texts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise InvalidRequestError(f"content part of type {kind!r} is not supported")
        return "".join(texts)
    raise InvalidRequestError(f"message content of type {type(content).__name__} is not valid")


def canonical_json(obj: Any) -> str:
    """Canonical JSON text: sorted keys, no spaces, UTF-8 kept (hashing and comparisons)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


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


# --------------------------------------------------------------------------- template


@dataclass(frozen=True)
class PromptPlan:
    """A prompt ready to send.

    Attributes:
        prompt_ids: list[int], length P: the prompt tokens.
        extends: index of the completion it continues, or None for a fresh render.
        num_new_tokens: tokens rendered for this request (all P for a fresh render).
    """

    prompt_ids: list[int]
    extends: int | None
    num_new_tokens: int


class ChatTemplate:
    """A tokenizer's chat template, its end-of-turn token, and the token chain.

    Args:
        tokenizer: a transformers tokenizer with a ``chat_template``.

    Raises:
        ConfigError: the tokenizer has no chat template, or its end-of-turn token cannot be
            determined from the template and the tokenizer's special tokens.
    """

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        # HF fast tokenizers are not safe to share between threads in every mode; renders run
        # in worker threads, so they take turns.
        self._lock = threading.Lock()
        self.end_of_turn_text, self.trailer = self._find_end_of_turn()
        self.end_of_turn_id = self._single_token_id(self.end_of_turn_text)

    # -- derivation of the end-of-turn token -------------------------------------------
    def _special_tokens(self) -> list[str]:
        tokens = set()
        eos = getattr(self.tokenizer, "eos_token", None)
        if isinstance(eos, str) and eos:
            tokens.add(eos)
        for added in getattr(self.tokenizer, "added_tokens_decoder", {}).values():
            if getattr(added, "special", False):
                tokens.add(str(added))
        for tok in getattr(self.tokenizer, "all_special_tokens", []):
            tokens.add(tok)
        return sorted(tokens, key=len, reverse=True)

    def _find_end_of_turn(self) -> tuple[str, str]:
        probe = [{"role": "user", "content": _PROBE_USER},
                 {"role": "assistant", "content": _PROBE_ANSWER}]
        text = self._render_text_unlocked(probe, None, add_generation_prompt=False)
        at = text.rfind(_PROBE_ANSWER)
        if at < 0:
            raise ConfigError("the chat template does not render the assistant's content")
        after = text[at + len(_PROBE_ANSWER):]
        for token in self._special_tokens():
            if after.startswith(token):
                return token, after[len(token):]
        raise ConfigError(
            "cannot determine the chat template's end-of-turn token: the text after an "
            f"assistant turn is {after[:40]!r}, which starts with no special token"
        )

    def _single_token_id(self, token: str) -> int:
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ConfigError(f"end-of-turn token {token!r} is not one token: {ids}")
        return int(ids[0])

    # -- rendering -----------------------------------------------------------------------
    def _render_text_unlocked(self, messages: Sequence[dict[str, Any]],
                              tools: Sequence[dict[str, Any]] | None,
                              add_generation_prompt: bool) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                template_messages(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
            )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as e:
            raise InvalidRequestError(
                f"the chat template cannot render these messages: {e}") from e
        if not isinstance(text, str):
            raise ConfigError(f"apply_chat_template returned {type(text).__name__}, not text")
        return text

    def render_text(self, messages: Sequence[dict[str, Any]],
                    tools: Sequence[dict[str, Any]] | None = None, *,
                    add_generation_prompt: bool = True) -> str:
        """Render messages and tools to prompt text with the model's template.

        Raises:
            InvalidRequestError: the template rejects the messages.
        """
        with self._lock:
            return self._render_text_unlocked(messages, tools, add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added (the template wrote them)."""
        with self._lock:
            return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens kept."""
        with self._lock:
            return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def render(self, messages: Sequence[dict[str, Any]],
               tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """Fresh prompt ids with the generation prompt.

        Returns:
            list[int], length P.
        """
        return self.encode(self.render_text(messages, tools, add_generation_prompt=True))

    # -- the token chain -------------------------------------------------------------------
    def find_extended(self, messages: Sequence[dict[str, Any]],
                      tools: Sequence[dict[str, Any]],
                      completions: Sequence[Completion]) -> Completion | None:
        """The completion whose conversation and answer ``messages`` continue, if any.

        A completion ``c`` matches when the request has the same tools, starts with
        ``c.messages`` and then ``c``'s answer (compared by :func:`message_signature`).
        Among matches the longest conversation wins, then the latest.

        Args:
            messages: the request's messages.
            tools: the request's tools.
            completions: the session's completions so far, in index order.
        """
        signatures = [message_signature(m) for m in messages]
        tools_key = canonical_json(list(tools))
        best: Completion | None = None
        for completion in reversed(completions):
            k = len(completion.messages)
            if not completion.response_ids or completion.finish_reason == "error":
                continue
            if len(signatures) <= k or (best is not None and k <= len(best.messages)):
                continue
            if canonical_json(completion.tools) != tools_key:
                continue
            if signatures[k] != message_signature(completion.response_message):
                continue
            if [message_signature(m) for m in completion.messages] != signatures[:k]:
                continue
            best = completion
        return best

    def build_prompt(self, messages: Sequence[dict[str, Any]],
                     tools: Sequence[dict[str, Any]],
                     completions: Sequence[Completion]) -> PromptPlan:
        """The prompt of a request: chained onto an earlier completion when it continues one.

        Args:
            messages: the request's messages (OpenAI chat shape).
            tools: the request's tools.
            completions: the session's completions so far, in index order.

        Returns:
            The prompt ids and the index of the completion continued (None: fresh render).
            Invariant: a chained prompt starts with ``c.prompt_ids + c.response_ids``.

        Raises:
            InvalidRequestError: the template rejects the messages.
        """
        full_text = self.render_text(messages, tools, add_generation_prompt=True)
        previous = self.find_extended(messages, tools, completions)
        if previous is not None:
            k = len(previous.messages)
            upto_text = self.render_text(messages[:k + 1], tools, add_generation_prompt=False)
            turn_end = self.end_of_turn_text + self.trailer
            if full_text.startswith(upto_text) and upto_text.endswith(turn_end):
                new_ids = self.encode(self.trailer + full_text[len(upto_text):])
                chained = list(previous.prompt_ids) + list(previous.response_ids)
                if previous.response_ids[-1] != self.end_of_turn_id:
                    chained.append(self.end_of_turn_id)
                return PromptPlan(prompt_ids=chained + new_ids, extends=previous.index,
                                  num_new_tokens=len(new_ids))
            log.warning("chain_break", extends=previous.index,
                        reason="rendered conversation does not extend the earlier one")
        prompt_ids = self.encode(full_text)
        return PromptPlan(prompt_ids=prompt_ids, extends=None, num_new_tokens=len(prompt_ids))
