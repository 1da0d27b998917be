"""Llama-3 JSON and Mistral tool-call parsers, ``<think>`` reasoning parsers, and the
per-model registry.

Formats: Meta Llama 3.1 prompt format, "JSON based tool calling"
(https://www.llama.com/docs/model-cards-and-prompt-formats/llama3_1/); Mistral function
calling (https://docs.mistral.ai/capabilities/function_calling/) and vLLM's
``mistral_tool_parser.py``; ``<think>`` as in vLLM's reasoning parsers
(https://docs.vllm.ai/en/latest/features/reasoning_outputs.html).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rolloutd.errors import ConfigError
from rolloutd.proxy.render.reasoning_parsers import get_reasoning_parser, parsers_for_model
from rolloutd.proxy.render.tool_parsers import get_tool_parser


def calls(parsed: object) -> list[tuple[str, dict[str, object]]]:
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls
    ]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "f", "parameters": {"a": 1}}',
        '<|python_tag|>{"name": "f", "parameters": {"a": 1}}',
        '  {"name": "f", "arguments": {"a": 1}}\n',
    ],
)
def test_llama3_json_calls(text: str) -> None:
    parsed = get_tool_parser("llama3_json").parse(text)
    assert parsed.content is None and calls(parsed) == [("f", {"a": 1})]


def test_llama3_json_several_calls_and_non_calls() -> None:
    parser = get_tool_parser("llama3_json")
    two = parser.parse('{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"x": 2}}')
    assert calls(two) == [("f", {}), ("g", {"x": 2})]
    for text in ["Hello {there}", '{"answer": 42}', '{"name": "f", "parameters": {']:
        assert parser.parse(text).content == text and parser.parse(text).tool_calls == []
    assert parser.streamable("Hello") == "Hello"
    assert parser.streamable('{"na') == "" and parser.streamable("<|python") == ""


def test_mistral_both_syntaxes() -> None:
    parser = get_tool_parser("mistral")
    v3 = parser.parse(
        'Sure. [TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]'
    )
    assert v3.content == "Sure." and calls(v3) == [("f", {"a": 1}), ("g", {})]
    v11 = parser.parse('[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}')
    assert v11.content is None and calls(v11) == [("f", {"a": 1}), ("g", {})]
    broken = "[TOOL_CALLS][{oops"
    assert parser.parse(broken).content == broken and parser.parse(broken).tool_calls == []
    assert parser.streamable("Sure. [TOOL_C") == "Sure."


def test_think_split() -> None:
    think = get_reasoning_parser("think")
    assert think is not None
    assert think.split("<think>\nhmm\n</think>\n\nHi") == ("hmm", "Hi")
    assert think.split("Hi <think>x</think>") == (None, "Hi <think>x</think>")
    assert think.split("<think>cut off") == ("cut off", "")
    prompted = get_reasoning_parser("think_prompted")
    assert prompted is not None and prompted.split("hmm</think>Hi") == ("hmm", "Hi")
    assert get_reasoning_parser("none") is None
    with pytest.raises(ConfigError):
        get_reasoning_parser("nope")


@given(
    reasoning=st.text(max_size=20).filter(lambda s: "<" not in s),
    answer=st.text(max_size=20),
    cut=st.integers(0, 80),
)
def test_think_partial_is_a_prefix_of_the_final(reasoning: str, answer: str, cut: int) -> None:
    think = get_reasoning_parser("think")
    assert think is not None
    text = f"<think>{reasoning}</think>{answer}"
    final_reasoning, final_rest = think.split(text)
    partial_reasoning, partial_rest = think.split_partial(text[:cut])
    assert (final_reasoning or "").startswith(partial_reasoning)
    if partial_rest is not None:
        assert final_rest.startswith(partial_rest)


def test_registry_per_model() -> None:
    assert parsers_for_model("qwen2.5-coder-0.5b").tool_parser == "hermes"
    assert parsers_for_model("Qwen/Qwen3-8B").reasoning_parser == "think"
    assert parsers_for_model("meta-llama/Llama-3.1-8B-Instruct").tool_parser == "llama3_json"
    assert parsers_for_model("mistralai/Mistral-7B-Instruct-v0.3").tool_parser == "mistral"
    assert parsers_for_model("deepseek-ai/DeepSeek-R1").reasoning_parser == "think_prompted"
