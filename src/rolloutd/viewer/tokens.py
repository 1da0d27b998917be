"""Tokens as HTML: every token of a trace decoded and rendered as one ``<span>``, its classes
saying whether it trains (``loss_mask``), how likely it was (a logprob shade), and whether a
later prompt re-rendered it differently (drift).

A 32K-token trace must stay usable in a browser, so a token is a bare ``<span>`` with at most
two short classes styled by one stylesheet (:data:`TOKEN_CSS`); nothing per token lives in
JavaScript. Its id and logprob are in one JSON array per trace, which the page's single hover
handler reads by the token's position.
"""

from __future__ import annotations

import codecs
import html
from collections.abc import Sequence
from typing import Any

from rolloutd.trajectory.tokenizer import ReasoningSpans

#: logprob shade buckets: a trainable token's class ``k{b}``, b the first bound it is above
#: (0: almost certain, 4: below -2.0 nats)
LOGPROB_BOUNDS = (-0.1, -0.5, -1.0, -2.0)

TOKEN_CSS = """
.toks{white-space:pre-wrap;word-break:break-word;font:12px/1.5 ui-monospace,monospace;
 border:1px solid #ccc;padding:6px;max-height:70vh;overflow:auto;margin:4px 0}
.toks span:hover{outline:1px solid #000}
.prompt span{color:#666}
.prompt span:nth-child(odd){background:#f4f4f4}
.k0{background:#b7f0b1}.k1{background:#d3f2a0}.k2{background:#f2ec9a}
.k3{background:#f7c98b}.k4{background:#f59a8a}
.n{color:#777;background:#eef1f7}
.d{text-decoration:underline wavy #c00;text-decoration-skip-ink:none}
.r{font-style:italic}
.s{font-weight:bold}
.cb{display:inline-block;font-size:10px;color:#fff;background:#446;border-radius:3px;
 padding:0 3px;margin:0 2px;user-select:none}
"""


def shade(logprob: float) -> int:
    """The shade bucket of a sampled token's logprob (0..4, see :data:`LOGPROB_BOUNDS`)."""
    for bucket, bound in enumerate(LOGPROB_BOUNDS):
        if logprob > bound:
            return bucket
    return len(LOGPROB_BOUNDS)


class TokenText:
    """Decodes token ids into per-token display text.

    Byte-level BPE tokens (Qwen, Llama 3, GPT-2) map to bytes; a UTF-8 character split over
    several tokens appears on the token that completes it (an incremental decoder), so the
    concatenated texts equal the decoded sequence. Special tokens show as their content
    (``<|im_end|>``).

    Args:
        tokenizer: a transformers tokenizer of the model that sampled the trace.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._bytes = ReasoningSpans(tokenizer)
        special = set(getattr(tokenizer, "all_special_ids", None) or [])
        for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(added, "special", False):  # Qwen's <|im_start|> is only here
                special.add(token_id)
        self.special_ids: set[int] = {int(i) for i in special}

    def texts(self, ids: Sequence[int]) -> list[str]:
        """One string per token of ``ids`` (length N -> length N); empty where a token only
        starts a character that a later token completes."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        out = [decoder.decode(self._bytes.token_bytes(int(i))) for i in ids]
        if out:
            out[-1] += decoder.decode(b"", final=True)
        return out


def prompt_html(texts: Sequence[str]) -> str:
    """The prompt's tokens: one ``<span>`` each (none trains)."""
    return "".join(f"<span>{html.escape(t)}</span>" for t in texts)


def response_html(
    texts: Sequence[str],
    ids: Sequence[int],
    loss_mask: Sequence[int],
    response_logprobs: Sequence[float],
    *,
    drift_positions: Sequence[int] = (),
    recomputed_positions: Sequence[int] = (),
    completion_offsets: Sequence[tuple[int, int]] = (),
    special_ids: set[int] | None = None,
) -> str:
    """A trace's response tokens, one ``<span>`` each.

    Classes: ``k0``..``k4`` a trainable token (``loss_mask`` 1) shaded by its logprob
    (:func:`shade`); ``n`` a token that does not train (a tool result, a user turn, a
    re-rendered template piece); ``d`` added at a drift position; ``r`` at a recomputed
    logprob; ``s`` on a special token. A ``<b class="cb">`` marker (not a span) starts each
    merged completion.

    Args:
        texts, ids, loss_mask, response_logprobs: aligned, length R each.
        drift_positions, recomputed_positions: positions in 0..R-1.
        completion_offsets: (position, completion index) pairs, where each completion's
            sampled tokens start.
        special_ids: token ids rendered bold.

    Raises:
        ValueError: the arrays are not aligned.
    """
    n = len(ids)
    if not (len(texts) == len(loss_mask) == len(response_logprobs) == n):
        raise ValueError(
            f"response arrays not aligned: ids {n}, texts {len(texts)}, "
            f"loss_mask {len(loss_mask)}, logprobs {len(response_logprobs)}"
        )
    drift, recomputed = set(drift_positions), set(recomputed_positions)
    starts: dict[int, list[int]] = {}
    for position, index in completion_offsets:
        starts.setdefault(position, []).append(index)
    special = special_ids or set()
    parts: list[str] = []
    for i in range(n):
        for index in starts.get(i, ()):
            parts.append(f'<b class="cb">#{index}</b>')
        cls = f"k{shade(response_logprobs[i])}" if loss_mask[i] else "n"
        if i in drift:
            cls += " d"
        if i in recomputed:
            cls += " r"
        if ids[i] in special:
            cls += " s"
        parts.append(f'<span class="{cls}">{html.escape(texts[i])}</span>')
    return "".join(parts)
