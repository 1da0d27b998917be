"""What builders need to know about a tokenizer: its end-of-turn token and its reasoning spans.

Both come from the model's own tokenizer and chat template, never from the completion log:
a builder that guessed the end-of-turn token from the data would insert the wrong token after a
turn that ended by length. The rule: the end-of-turn token comes from the tokenizer and chat
template, never guessed from data; an unknown one is a clear error.
"""

from __future__ import annotations

import bisect
from functools import lru_cache
from typing import Any, Protocol

from rolloutd.errors import BuilderError

#: content of the probe assistant turn; chosen so that no tokenizer merges it with what follows.
_SENTINEL = "ROLLOUTD_END_OF_TURN_PROBE"


class ReasoningSpanFn(Protocol):
    """Callable that locates reasoning in sampled tokens (the ``reasoning_spans`` argument).

    Called with ``response_ids: list[int]`` (length R) and returns half-open token ranges
    ``[(start, end), ...]`` with ``0 <= start < end <= R``, in order and non-overlapping.
    """

    def __call__(self, response_ids: list[int], /) -> list[tuple[int, int]]: ...


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(token_id))
    return ids


def end_of_turn_id(tokenizer: Any) -> int:
    """Derive the token that ends an assistant turn from the tokenizer's chat template.

    Renders a two-message conversation whose assistant content is a sentinel and takes the
    first token the template writes after it; that token must be a special token of the
    tokenizer (Qwen: ``<|im_end|>``, Llama 3: ``<|eot_id|>``, Mistral: ``</s>``). A tokenizer
    without a chat template falls back to its ``eos_token_id``.

    Args:
        tokenizer: a transformers tokenizer (``PreTrainedTokenizerBase``) of the served model.

    Returns:
        The end-of-turn token id.

    Raises:
        BuilderError: the template renders no special token right after the assistant turn,
            or there is neither a template nor an eos token.
    """
    if not getattr(tokenizer, "chat_template", None):
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise BuilderError(
                "cannot determine the end-of-turn token: the tokenizer has "
                "neither a chat template nor an eos token"
            )
        return int(eos)
    messages = [{"role": "user", "content": "ping"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as error:
        raise BuilderError(
            f"cannot determine the end-of-turn token: the chat template "
            f"failed to render an assistant turn: {error}"
        ) from error
    at = text.rfind(_SENTINEL)
    after = text[at + len(_SENTINEL) :] if at >= 0 else ""
    ids = tokenizer.encode(after, add_special_tokens=False) if after else []
    if not ids or ids[0] not in _special_ids(tokenizer):
        raise BuilderError(
            "cannot determine the end-of-turn token: the chat template writes "
            f"{after[:40]!r} after an assistant turn, which does not start with a special token"
        )
    return int(ids[0])


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` (byte-level BPE: Qwen, Llama 3, GPT-2)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class ReasoningSpans:
    """Locates ``<think>…</think>`` reasoning in sampled tokens, by byte offsets.

    Each token id is mapped to the bytes it stands for (byte-level BPE through the inverse of
    ``bytes_to_unicode``; other tokenizers through ``decode([id])``); the markers are searched
    in the concatenated bytes and every token that overlaps a span is reasoning. This works
    whether the markers are single special tokens (Qwen3, DeepSeek-R1) or ordinary text that
    tokenizes into several tokens (Qwen2.5). An unclosed span (a turn cut by length inside its
    reasoning) runs to the end of the response.

    Args:
        tokenizer: a transformers tokenizer.
        open_marker: text that opens reasoning.
        close_marker: text that closes it.
    """

    def __init__(
        self, tokenizer: Any, open_marker: str = "<think>", close_marker: str = "</think>"
    ) -> None:
        self._tokenizer = tokenizer
        self._open = open_marker.encode()
        self._close = close_marker.encode()
        self._special = _special_ids(tokenizer)
        self._bytes: dict[int, bytes] = {}

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (cached); special tokens map to their content."""
        cached = self._bytes.get(token_id)
        if cached is not None:
            return cached
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        decoder = _byte_decoder()
        if (
            piece is not None
            and token_id not in self._special
            and all(ch in decoder for ch in piece)
        ):
            value = bytes(decoder[ch] for ch in piece)
        else:
            value = self._tokenizer.decode([token_id]).encode()
        self._bytes[token_id] = value
        return value

    def __call__(self, response_ids: list[int]) -> list[tuple[int, int]]:
        """Return the reasoning spans of ``response_ids`` (length R) as half-open token ranges."""
        starts: list[int] = []
        pieces: list[bytes] = []
        offset = 0
        for token_id in response_ids:
            starts.append(offset)
            piece = self.token_bytes(token_id)
            pieces.append(piece)
            offset += len(piece)
        text = b"".join(pieces)
        spans: list[tuple[int, int]] = []
        at = text.find(self._open)
        while at >= 0:
            close = text.find(self._close, at + len(self._open))
            end_byte = len(text) if close < 0 else close + len(self._close)
            first = bisect.bisect_right(starts, at) - 1
            last = bisect.bisect_left(starts, end_byte)  # first token starting at/after the end
            if spans and first < spans[-1][1]:
                spans[-1] = (spans[-1][0], max(last, spans[-1][1]))
            else:
                spans.append((first, last))
            if close < 0:
                break
            at = text.find(self._open, end_byte)
        return spans
