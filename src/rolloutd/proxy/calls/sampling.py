"""The sampling values of one gateway call: the task's or the harness's (the task's
``policy``), and ``max_tokens`` bounded by the context left after the prompt.

Split from :mod:`rolloutd.proxy.calls.service`, which re-exports both functions.
"""

from __future__ import annotations

from rolloutd.errors import ContextLengthError
from rolloutd.proxy.core.call_types import SamplingOverrides
from rolloutd.types import SamplingParams


def resolve_sampling(task: SamplingParams, harness: SamplingOverrides) -> SamplingParams:
    """The sampling values of one call.

    ``policy == "respect"`` keeps the harness's temperature, top_p and max_tokens where it sent
    them; ``override`` uses the task's values only. top_k and seed always come from the task.

    Args:
        task: the session's sampling parameters.
        harness: the values in the request.

    Returns:
        The values to sample with (``max_tokens`` before the context bound).
    """
    if task.policy != "respect":
        return task
    update = {name: value for name, value in harness.model_dump().items() if value is not None}
    return task.model_copy(update=update)


def bound_max_tokens(max_tokens: int, num_prompt_tokens: int, ctx_size: int) -> int:
    """``max_tokens`` cut to the context left after the prompt.

    Args:
        max_tokens: tokens asked for.
        num_prompt_tokens: P.
        ctx_size: the backend's context window per sequence.

    Returns:
        ``min(max_tokens, ctx_size - P)``, at least 1.

    Raises:
        ContextLengthError: ``P >= ctx_size``: no room for one sampled token.
    """
    room = ctx_size - num_prompt_tokens
    if room < 1:
        raise ContextLengthError(
            f"this model's maximum context length is {ctx_size} tokens, but the prompt has "
            f"{num_prompt_tokens} tokens, which leaves no room for the completion"
        )
    return min(max_tokens, room)
