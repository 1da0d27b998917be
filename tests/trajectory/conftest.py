"""Fixtures of the builder tests: the real Qwen2.5 tokenizer, loaded once per test session."""

from __future__ import annotations

from typing import Any

import pytest
from session_generator import SessionGenerator

from rolloutd.trajectory import ReasoningSpans, end_of_turn_id


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """Qwen2.5-Coder-0.5B-Instruct's tokenizer with its official chat template."""
    from rolloutd.engine.models import load_tokenizer

    return load_tokenizer("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def eot(tokenizer: Any) -> int:
    return end_of_turn_id(tokenizer)


@pytest.fixture(scope="session")
def reasoning(tokenizer: Any) -> ReasoningSpans:
    return ReasoningSpans(tokenizer)


@pytest.fixture(scope="session")
def generator(tokenizer: Any) -> SessionGenerator:
    return SessionGenerator(tokenizer)
