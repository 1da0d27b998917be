"""The stack's engines in ``rolloutd status`` (and in what ``up`` prints): the one it runs or
the one it uses without running it, and for each URL whether it answers, asked of a real
llama-server (the tests' engine) and of a port where nothing listens. Also what ``up`` hands
its fleets for an engine it does not run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from rolloutd.cli.commands.status import render
from rolloutd.cli.tables import text
from rolloutd.processes import free_port
from rolloutd.stack.local import LocalStack
from rolloutd.stack.state import EngineState, ExternalEngine, StackState, write_state
from rolloutd.stack.status import collect

QWEN = "Qwen2.5-Coder-0.5B-Instruct"


def cells(shown: str, first: str) -> list[str]:
    """The cells of the row whose first cell is ``first`` (cells stand 2+ spaces apart)."""
    row = next(line for line in shown.splitlines() if line.startswith(first + " "))
    return re.split(r"\s{2,}", row.strip())


def external(*urls: str, model: str = QWEN, **fields: Any) -> ExternalEngine:
    return ExternalEngine(
        urls=list(urls), kind="llama_cpp", model=model, tokenizer="/tok", **fields
    )


@pytest.mark.engine
def test_status_says_which_engine_urls_answer(engine: Any, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    write_state(
        tmp_path,
        StackState(home=str(tmp_path), phase="running", external_engine=external(engine.url, dead)),
    )
    status = collect(tmp_path)
    assert status is not None
    [answers, silent] = status.engines
    assert answers.is_kind and answers.context_size and answers.models == [QWEN]
    assert not silent.answers and "ConnectError" in (silent.error or "")
    shown = text(render(status))
    assert (
        f"engine not run by this stack: llama_cpp, model {QWEN}, tokenizer /tok, capture mode "
        "tokens, a pool of 2"
    ) in shown.splitlines()
    assert cells(shown, engine.url) == [
        engine.url,
        "llama_cpp",
        "yes",
        str(answers.context_size),
        QWEN,
    ]
    [url, kind, says, context, why] = cells(shown, dead)
    assert (url, kind, says, context) == (dead, "llama_cpp", "NO", "-")
    assert why.startswith("does not answer: ") and "ConnectError" in why


@pytest.mark.engine
def test_status_asks_the_engine_the_stack_runs_too(engine: Any, tmp_path: Path) -> None:
    state = StackState(
        home=str(tmp_path),
        phase="running",
        engine=EngineState(
            model="qwen2.5-coder-0.5b",
            model_file="/m.gguf",
            url=engine.url,
            num_slots=4,
            ctx_size=65536,
        ),
    )
    write_state(tmp_path, state)
    status = collect(tmp_path)
    assert status is not None
    shown = text(render(status))
    assert (
        "engine qwen2.5-coder-0.5b (/m.gguf), run by this stack, policy version 0, slots 0/4 "
        "busy, context 65536 tokens"
    ) in shown.splitlines()
    assert cells(shown, engine.url)[:3] == [engine.url, "llama_cpp", "yes"]


def test_a_stopped_stack_asks_no_engine(tmp_path: Path) -> None:
    write_state(
        tmp_path,
        StackState(home=str(tmp_path), phase="stopped", external_engine=external("http://a:1")),
    )
    status = collect(tmp_path)
    assert status is not None and status.engines == []
    shown = text(render(status))
    assert "engine not run by this stack: llama_cpp" in shown and "engine url" not in shown


def test_up_hands_the_fleets_the_engine_it_does_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROLLOUTD_TOOL_PARSER", raising=False)
    engine = external("http://a:1", "http://b:2", tokenizer_revision="abc")
    stack = LocalStack(home=tmp_path, fleets=(), external_engine=engine)
    env = stack.env()
    assert stack.engine_url == "http://a:1,http://b:2"  # so no llama-server is started
    assert env["ROLLOUTD_BACKEND_URL"] == "http://a:1,http://b:2"
    assert env["ROLLOUTD_BACKEND_TYPE"] == "llama_cpp" and env["ROLLOUTD_MODEL"] == QWEN
    assert env["ROLLOUTD_TOKENIZER"] == "/tok" and env["ROLLOUTD_TOKENIZER_REVISION"] == "abc"
    assert env["ROLLOUTD_CAPTURE_MODE"] == "tokens"
    # the catalog model's tool parser follows it to an engine that serves it under its name
    assert env["ROLLOUTD_TOOL_PARSER"] == "hermes_lenient"
    assert stack.state.external_engine == engine and stack.state.backend_url == stack.engine_url
    other = LocalStack(home=tmp_path, fleets=(), external_engine=external("http://a:1", model="m"))
    assert "ROLLOUTD_TOOL_PARSER" not in other.env()  # the gateway's choice by model name
