"""Does the engine serve the trainer's weights? Compare their logprobs on a probe prompt.

After a weight sync the engine and the trainer hold the same policy up to the export's rounding
(none for F32, the default; F16 drops small updates:
:func:`~rolloutd.trainer_client.training.gguf_export.export_gguf`). The probe asks the engine to
continue a fixed prompt greedily with the logprob of each token it picks, scores the same
tokens with the trainer's model, and reports the differences. A stale engine (a sync that did
not land) shows up as differences far above the rounding floor: one optimizer step moves
logprobs by more than the compute floor.

The engine is asked with ``cache_prompt: false``: a prompt served again from llama.cpp's cache
may report a shortened ``completion_probabilities`` list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import torch
from pydantic import BaseModel, Field


class ProbeResult(BaseModel):
    """Engine vs trainer logprobs of the tokens the engine chose greedily after the prompt.

    Invariant: ``len(response_ids) == len(engine_logprobs) == len(trainer_logprobs)``.
    """

    response_ids: list[int] = Field(description="greedy continuation, length R")
    engine_logprobs: list[float] = Field(description="the engine's logprob of each, nats")
    trainer_logprobs: list[float] = Field(description="the trainer's logprob of each, nats")
    mean_abs_diff: float = Field(ge=0, description="mean |engine - trainer|, nats")
    max_abs_diff: float = Field(ge=0, description="max |engine - trainer|, nats")


def engine_greedy_logprobs(
    engine_url: str, prompt_ids: Sequence[int], num_tokens: int, *, timeout_s: float = 120.0
) -> tuple[list[int], list[float]]:
    """Continue ``prompt_ids`` greedily on llama-server and return the tokens and logprobs.

    Args:
        engine_url: llama-server's base URL.
        prompt_ids: list[int], length P.
        num_tokens: R, tokens to generate (fewer when the model ends its turn).
        timeout_s: bound on the call, s.

    Returns:
        ``(response_ids, logprobs)``, both length R' <= R; logprobs in nats, from the
        model's distribution before sampling (llama.cpp's ``completion_probabilities``).

    Raises:
        httpx.HTTPStatusError: the engine answered an error.
    """
    response = httpx.post(
        f"{engine_url.rstrip('/')}/completion",
        json={
            "prompt": list(prompt_ids),
            "n_predict": num_tokens,
            "temperature": 0.0,
            "n_probs": 1,
            "cache_prompt": False,
            "return_tokens": True,
        },
        timeout=timeout_s,
    )
    response.raise_for_status()
    probs = response.json()["completion_probabilities"]
    return [int(p["id"]) for p in probs], [float(p["logprob"]) for p in probs]


def trainer_logprobs(
    model: Any, prompt_ids: Sequence[int], response_ids: Sequence[int]
) -> list[float]:
    """The model's logprob of each response token after the prompt (teacher forcing).

    Args:
        model: a causal LM (``transformers``), called as ``model(ids).logits``.
        prompt_ids: list[int], length P >= 1.
        response_ids: list[int], length R.

    Returns:
        list[float], length R, nats.
    """
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(list(response_ids))[:, None])[:, 0].tolist()


def probe(
    model: Any, engine_url: str, prompt_ids: Sequence[int], num_tokens: int = 16
) -> ProbeResult:
    """Compare the engine's and the trainer's logprobs on one greedy continuation.

    Args:
        model: the trainer's causal LM.
        engine_url: llama-server's base URL.
        prompt_ids: the probe prompt, list[int], length P.
        num_tokens: tokens to continue.

    Returns:
        The comparison; ``mean_abs_diff`` is the figure to hold at the export's floor
        (about 0.001 nats for an F32 export of SmolLM2-135M, 0.002 for F16 before training).
    """
    response_ids, engine = engine_greedy_logprobs(engine_url, prompt_ids, num_tokens)
    trainer = trainer_logprobs(model, prompt_ids, response_ids)
    diffs = [abs(a - b) for a, b in zip(engine, trainer, strict=True)]
    return ProbeResult(
        response_ids=response_ids,
        engine_logprobs=engine,
        trainer_logprobs=trainer,
        mean_abs_diff=sum(diffs) / max(len(diffs), 1),
        max_abs_diff=max(diffs, default=0.0),
    )
