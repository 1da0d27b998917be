"""The contexts an adapter or an evaluator is given, built once for every test that needs one
(harness adapters' tests, evaluators' tests)."""

from __future__ import annotations

from typing import Any

from rolloutd.evaluators.base import EvaluationContext
from rolloutd.sandbox.harnesses import HarnessContext
from rolloutd.types import EvaluatorSpec, SessionStatus

#: the session key the adapters' tests use (it must never show up in an argv)
SESSION_KEY = "sk-session-secret"
#: every dialect's base URL set
ALL_DIALECTS = ("openai", "anthropic", "gemini")
#: the served model name most tests use
MODEL = "Qwen2.5-Coder-0.5B-Instruct"


def harness_context(
    root: str = "http://127.0.0.1:8300/s/k",
    *,
    instruction: str = "make hello.py",
    api_key: str = SESSION_KEY,
    model: str = MODEL,
    dialects: tuple[str, ...] = ("openai",),
    **fields: Any,
) -> HarnessContext:
    """A session's :class:`HarnessContext` under a gateway session root.

    Args:
        root: the session's root URL (``{gateway}/s/{key}``); the OpenAI base URL is
            ``{root}/v1``.
        instruction: the task's instruction.
        api_key: the session key.
        model: the model name the harness sends.
        dialects: which base URLs are set (``openai`` always; ``anthropic``, ``gemini``: the
            root).
        fields: any other field, or a base URL set explicitly.
    """
    values: dict[str, Any] = {
        "instruction": instruction,
        "openai_base_url": f"{root}/v1",
        "api_key": api_key,
        "model": model,
    }
    for dialect in ("anthropic", "gemini"):
        if dialect in dialects:
            values[f"{dialect}_base_url"] = root
    return HarnessContext(**(values | fields))


def evaluation_context(spec: EvaluatorSpec, **overrides: Any) -> EvaluationContext:
    """An :class:`EvaluationContext` of a completed session of task ``t1`` (exit 0, three
    completions, one trace); ``overrides`` replace any field."""
    values: dict[str, Any] = {
        "task_id": "t1",
        "session_id": "t1/0",
        "status": SessionStatus.COMPLETED,
        "harness_exit_code": 0,
        "num_completions": 3,
        "num_traces": 1,
        "spec": spec,
    }
    return EvaluationContext(**(values | overrides))
