"""The end-of-turn token and reasoning spans come from the tokenizer, never from the data."""

from __future__ import annotations

import pytest

from rolloutd.errors import BuilderError
from rolloutd.trajectory import ReasoningSpans, end_of_turn_id


def test_qwen_end_of_turn_is_im_end(tokenizer):
    assert end_of_turn_id(tokenizer) == tokenizer.convert_tokens_to_ids("<|im_end|>")


class _PlainTemplate:
    """A tokenizer whose template ends assistant turns with a newline, not a special token."""

    chat_template = "{% for m in messages %}{{ m.content }}\n\n{% endfor %}"
    all_special_ids = (0,)
    eos_token_id = None

    def apply_chat_template(self, messages, tokenize=False):
        return "".join(m["content"] + "\n\n" for m in messages)

    def encode(self, text, add_special_tokens=False):
        return [ord(ch) for ch in text]


def test_an_end_of_turn_that_is_not_a_special_token_is_an_error():
    with pytest.raises(BuilderError, match="does not start with a special token"):
        end_of_turn_id(_PlainTemplate())


def test_no_template_and_no_eos_is_an_error():
    plain = _PlainTemplate()
    plain.chat_template = None
    with pytest.raises(BuilderError, match="neither a chat template nor an eos token"):
        end_of_turn_id(plain)


def test_reasoning_spans_cover_the_think_block(tokenizer):
    spans = ReasoningSpans(tokenizer)
    think = tokenizer.encode("<think>\n maybe plan\n</think>\n\n", add_special_tokens=False)
    answer = tokenizer.encode("OK file test", add_special_tokens=False)
    eot = end_of_turn_id(tokenizer)
    assert spans(think + answer + [eot]) == [(0, len(think))]
    assert spans(answer + [eot]) == []
    assert spans(think[:-3]) == [(0, len(think) - 3)]  # cut by length inside the reasoning
    assert spans(answer + think + answer) == [(len(answer), len(answer) + len(think))]
