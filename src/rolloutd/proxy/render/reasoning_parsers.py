"""Reasoning parsers, and the registry that picks a tool-call and a reasoning parser per model.

Reasoning parsers split sampled text into reasoning and answer. The ``think`` parser reads
``<think>...</think>`` at the start of the answer (Qwen3, QwQ, DeepSeek-R1 with the tag
sampled; vLLM ``reasoning/deepseek_r1_reasoning_parser.py`` and ``qwen3_reasoning_parser.py``).
``think_prompted`` is for templates that write ``<think>`` into the generation prompt, so the
sampled text starts inside the reasoning and only ``</think>`` is sampled (DeepSeek-R1-0528,
Qwen3 thinking-2507).

The sampled tokens stay as sampled: parsing only shapes the answer the harness sees.

:func:`parsers_for_model` chooses both parsers from the model name (first matching pattern
of :data:`MODEL_PARSERS`), as vLLM's ``--tool-call-parser`` / ``--reasoning-parser`` do by flag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rolloutd.errors import ConfigError

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def _held_back(text: str, marker: str) -> str:
    """``text`` without a tail that could still grow into ``marker`` (``"</thi"``)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return text[:-n]
    return text


@dataclass(frozen=True)
class ReasoningParser:
    """A ``<think>`` reasoning parser.

    Attributes:
        name: registry name.
        open_in_prompt: the template writes ``<think>`` into the prompt; the sampled text
            starts inside the reasoning.
    """

    name: str
    open_in_prompt: bool = False

    def _body(self, text: str) -> str | None:
        """The text after the opening tag, or None when the answer has no reasoning."""
        if self.open_in_prompt:
            return text.lstrip()
        stripped = text.lstrip()
        if not stripped.startswith(THINK_OPEN):
            return None
        return stripped[len(THINK_OPEN) :].lstrip()

    def split(self, text: str) -> tuple[str | None, str]:
        """Reasoning and answer of a whole sampled text.

        Args:
            text: the sampled text, end-of-turn token excluded.

        Returns:
            ``(reasoning, rest)``: ``reasoning`` stripped (None when there is none); ``rest``
            the answer after ``</think>`` with leading whitespace removed (``""`` when the
            text ended inside the reasoning). Without reasoning, ``(None, text)``.
        """
        body = self._body(text)
        if body is None:
            return None, text
        end = body.find(THINK_CLOSE)
        if end < 0:
            return body.strip(), ""
        return body[:end].strip(), body[end + len(THINK_CLOSE) :].lstrip()

    def split_partial(self, text: str) -> tuple[str, str | None]:
        """What can be streamed of a growing sampled text.

        Returns:
            ``(reasoning, rest)``: ``reasoning`` a prefix of the final reasoning; ``rest`` the
            answer so far once ``</think>`` was sampled, None while it is not decided yet
            (inside the reasoning, or a possible ``<think>`` still incomplete).
        """
        stripped = text.lstrip()
        if not self.open_in_prompt:
            if THINK_OPEN.startswith(stripped):
                return "", None  # may still become "<think>"
            if not stripped.startswith(THINK_OPEN):
                return "", text
        body = self._body(text) or ""
        end = body.find(THINK_CLOSE)
        if end < 0:
            return _held_back(body, THINK_CLOSE).rstrip(), None
        return body[:end].strip(), body[end + len(THINK_CLOSE) :].lstrip()


#: reasoning parser name -> parser
REASONING_PARSERS: dict[str, ReasoningParser] = {
    "think": ReasoningParser("think"),
    "think_prompted": ReasoningParser("think_prompted", open_in_prompt=True),
}


def get_reasoning_parser(name: str | None) -> ReasoningParser | None:
    """The reasoning parser registered as ``name``; None for None or ``"none"``.

    Raises:
        ConfigError: no parser of that name.
    """
    if name in (None, "none"):
        return None
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown reasoning parser {name!r}; known: {', '.join(sorted(REASONING_PARSERS))}"
        ) from None


@dataclass(frozen=True)
class ModelParsers:
    """The parsers of one model family.

    Attributes:
        tool_parser: name in :data:`rolloutd.proxy.render.tool_parsers.TOOL_PARSERS`.
        reasoning_parser: name in :data:`REASONING_PARSERS`, or None.
    """

    tool_parser: str
    reasoning_parser: str | None = None


#: (pattern on the lower-cased model name, parsers); the first match wins.
MODEL_PARSERS: list[tuple[re.Pattern[str], ModelParsers]] = [
    # Qwen3 and QwQ sample <think> themselves and call tools like Hermes (Qwen3 model card).
    (re.compile(r"qwen3|qwq"), ModelParsers("hermes", "think")),
    (re.compile(r"deepseek-r1"), ModelParsers("hermes", "think_prompted")),
    # Qwen2.5 and Hermes: <tool_call> blocks (Qwen2.5 model card, "Function calling").
    (re.compile(r"qwen|hermes"), ModelParsers("hermes")),
    # Llama 3.1+: JSON tool calls, optionally after <|python_tag|> (Meta's llama3.1 prompt
    # format docs, "JSON based tool calling").
    (re.compile(r"llama-?3"), ModelParsers("llama3_json")),
    # Mistral: [TOOL_CALLS] (mistral-common tokenizer v3+).
    (re.compile(r"mistral|mixtral|ministral|devstral|codestral"), ModelParsers("mistral")),
]


def parsers_for_model(model: str) -> ModelParsers:
    """The tool-call and reasoning parsers for ``model`` (``hermes``, none by default).

    Args:
        model: a catalog name, served name or folder, e.g. ``"qwen2.5-coder-0.5b"``.
    """
    name = model.lower()
    for pattern, parsers in MODEL_PARSERS:
        if pattern.search(name):
            return parsers
    return ModelParsers("hermes")
