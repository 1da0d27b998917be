"""The token markup of the viewer's pages, as pure functions (no browser, no model)."""

from __future__ import annotations

import pytest

from rolloutd.viewer.pages import _message_html
from rolloutd.viewer.tokens import LOGPROB_BOUNDS, response_html, shade


def test_shade_buckets_follow_the_bounds():
    assert [shade(x) for x in (0.0, -0.05, -0.3, -0.7, -1.5, -9.0)] == [0, 0, 1, 2, 3, 4]
    assert shade(LOGPROB_BOUNDS[0]) == 1  # a bound belongs to the next bucket


def test_each_response_token_is_one_span_with_its_classes():
    texts = ["a", "<b>", "c", "d"]
    markup = response_html(
        texts,
        [1, 2, 3, 4],
        [1, 0, 1, 1],
        [-0.01, 0.0, -3.0, -0.2],
        drift_positions=[2],
        recomputed_positions=[3],
        completion_offsets=[(0, 0), (2, 1)],
        special_ids={4},
    )
    assert markup == (
        '<b class="cb">#0</b><span class="k0">a</span>'
        '<span class="n">&lt;b&gt;</span><b class="cb">#1</b>'
        '<span class="k4 d">c</span><span class="k1 r s">d</span>'
    )


def test_misaligned_arrays_are_refused():
    with pytest.raises(ValueError, match="not aligned"):
        response_html(["a"], [1, 2], [1, 1], [0.0, 0.0])


def test_tool_calls_and_results_are_shown_as_such():
    call = _message_html(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "write_file", "arguments": '{"path": "a.py"}'},
                }
            ],
        }
    )
    assert 'class="msg toolcall"' in call
    assert "write_file({&quot;path&quot;: &quot;a.py&quot;})" in call
    result = _message_html({"role": "tool", "tool_call_id": "c1", "content": "wrote 3"})
    assert 'class="msg toolresult"' in result and "wrote 3" in result


@pytest.mark.engine
def test_token_texts_join_to_the_decoded_text_and_specials_are_known():
    from rolloutd.engine.models import load_tokenizer
    from rolloutd.viewer import TokenText

    tokenizer = load_tokenizer("qwen2.5-coder-0.5b")
    tokens = TokenText(tokenizer)
    text = "<|im_start|>user\nhéllo 世界 🙂 ok<|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    texts = tokens.texts(ids)
    assert len(texts) == len(ids) and "".join(texts) == tokenizer.decode(ids) == text
    # 🙂 is split over byte tokens: it shows once, on the token that completes it
    assert sum("🙂" in t for t in texts) == 1
    assert {ids[0], ids[-1]} <= tokens.special_ids  # <|im_start|>, <|im_end|>
