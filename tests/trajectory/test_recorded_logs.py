"""Builders on completion logs recorded from real harness runs through the gateway.

Each folder under ``fixtures/`` holds one session's completion log exactly as the gateway wrote
it (``completions/*.json``, from ``rolloutd demo``: qwen-code in bwrap against
Qwen2.5-Coder-0.5B-Instruct on llama-server) and ``expected.json``: the traces each builder
must produce, reviewed by hand when the fixture was recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rolloutd.trajectory import build_traces, check_invariants
from rolloutd.types import BuilderSpec, Completion

FIXTURES = sorted(p for p in (Path(__file__).parent / "fixtures").iterdir() if p.is_dir())
#: Qwen2.5's <|im_end|>, the end-of-turn token of the recorded sessions' chat template.
QWEN_END_OF_TURN = 151645


def load(folder: Path) -> tuple[list[Completion], dict]:
    completions = [
        Completion.model_validate_json(p.read_text())
        for p in sorted((folder / "completions").glob("*.json"))
    ]
    return completions, json.loads((folder / "expected.json").read_text())


def shape(traces) -> list[dict]:
    return [
        {
            "completion_indices": t.completion_indices,
            "num_prompt_tokens": len(t.prompt_ids),
            "num_response_tokens": len(t.response_ids),
            "num_trainable_tokens": sum(t.loss_mask),
        }
        for t in traces
    ]


@pytest.mark.parametrize("folder", FIXTURES, ids=[p.name for p in FIXTURES])
@pytest.mark.parametrize("builder", ["prefix_merging", "per_request"])
def test_recorded_session_builds_the_expected_traces(folder: Path, builder: str):
    completions, expected = load(folder)
    traces, stats = build_traces(
        completions, BuilderSpec(type=builder), end_of_turn_id=QWEN_END_OF_TURN
    )
    check_invariants(traces, completions)
    assert shape(traces) == expected[builder]["traces"]
    assert stats.num_chains == expected[builder]["num_chains"]
    assert stats.num_drift_tokens == 0  # tokens mode: zero by construction


def test_fixtures_exist():
    assert FIXTURES, "no recorded completion logs under tests/trajectory/fixtures"
