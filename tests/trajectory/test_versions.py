"""Policy versions per token and token-weighted staleness, on a completion log recorded from a
real harness run (qwen-code against llama-server, ``fixtures/qwen_code_write_file_0``), its
calls stamped as a session that spanned three weight updates would have them: each call
holds its backend's lease while it runs, and a sync changes the version only once no lease
is held, so the version is constant within a completion. The buffer's rules
(:mod:`rolloutd.workflows.buffer.rules`, the code its workflow runs) keep or drop the groups
built from it; the same rule through a real buffer, with versions stamped by real weight syncs,
is ``tests/trainer_client/training/test_weight_sync_load.py`` (acceptance tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolloutd.scoring import scored_rewards
from rolloutd.trajectory import build_traces
from rolloutd.trajectory.versions import token_policy_versions
from rolloutd.types import (
    BuilderSpec,
    Completion,
    GroupRef,
    SamplingUsed,
    SessionResult,
    SessionStatus,
)
from rolloutd.workflows.buffer.models import BufferConfig
from rolloutd.workflows.buffer.rules import arrival_drop_reason, group_staleness
from rolloutd.workflows.task import summarize

FIXTURE = Path(__file__).parent / "fixtures" / "qwen_code_write_file_0" / "completions"
QWEN_END_OF_TURN = 151645


def recorded(versions: list[int], modes: list[str] | None = None) -> list[Completion]:
    completions = [
        Completion.model_validate_json(p.read_text()) for p in sorted(FIXTURE.glob("*.json"))
    ]
    for i, completion in enumerate(completions):
        completion.policy_version = versions[i]
        completion.logprob_mode = (modes or ["raw"] * len(completions))[i]  # type: ignore[assignment]
        completion.sampling = SamplingUsed(temperature=0.7, top_p=1.0, max_tokens=512)
    return completions


def session(completions: list[Completion], index: int) -> SessionResult:
    traces, stats = build_traces(
        completions, BuilderSpec(type="prefix_merging"), end_of_turn_id=QWEN_END_OF_TURN
    )
    return SessionResult(
        session_id=f"t/{index}",
        task_id="t",
        sample_index=index,
        status=SessionStatus.COMPLETED,
        reward=float(index % 2),
        stats=stats,
        num_trainable_tokens=stats.num_trainable_tokens,
    )


def test_a_session_over_three_versions_counts_each_token_at_its_own():
    completions = recorded([3, 4, 5, 5])
    traces, stats = build_traces(
        completions, BuilderSpec(type="prefix_merging"), end_of_turn_id=QWEN_END_OF_TURN
    )
    by_index = {c.index: c for c in completions}
    expected_total = expected_weighted = 0
    for trace in traces:
        versions = token_policy_versions(trace)
        assert len(versions) == len(trace.response_ids)
        for k, (index, offset) in enumerate(
            zip(trace.completion_indices, trace.response_offsets, strict=True)
        ):
            sampled = by_index[index].response_ids
            # every sampled token carries the version of the completion that sampled it
            assert trace.response_ids[offset : offset + len(sampled)] == sampled
            assert set(versions[offset : offset + len(sampled)]) == {by_index[index].policy_version}
            trained = sum(trace.loss_mask[offset : offset + len(sampled)])
            expected_total += trained
            expected_weighted += trained * by_index[index].policy_version
            assert trace.logprob_modes[k] == "raw" and trace.sampling[k].temperature == 0.7
    assert stats.policy_versions == [3, 4, 5]
    assert (stats.min_policy_version, stats.max_policy_version) == (3, 5)
    assert stats.token_weighted_policy_version == pytest.approx(expected_weighted / expected_total)
    # the mean leans to where the tokens are, strictly inside the range here
    assert 3 < stats.token_weighted_policy_version < 5
    # at buffer version 6 the token-weighted staleness is below the start version's (3)
    assert 6 - stats.token_weighted_policy_version < 6 - 3


def test_the_group_reference_carries_the_weighted_version_and_flags_mixed_modes():
    one = session(recorded([3, 4, 5, 5]), 0)
    two = session(recorded([5, 5, 5, 5]), 1)
    group = summarize("t", [one, two])
    ref = GroupRef.of(group, "groups/t.json", scored_rewards(group))
    n1, n2 = one.stats.num_trainable_tokens, two.stats.num_trainable_tokens
    weighted = (one.stats.token_weighted_policy_version * n1 + 5 * n2) / (n1 + n2)
    assert ref.token_weighted_policy_version == pytest.approx(weighted)
    assert (ref.min_policy_version, ref.max_policy_version) == (3, 5)
    assert not ref.mixed_logprob_modes and group.logprob_modes == ["raw"]

    # a session whose backend reported logprobs after temperature beside a raw one: flagged
    mixed = session(recorded([5, 5, 5, 5], ["temperature"] * 4), 1)
    group = summarize("t", [one, mixed])
    assert group.mixed_logprob_modes and group.logprob_modes == ["raw", "temperature"]
    assert GroupRef.of(group, "", scored_rewards(group)).mixed_logprob_modes


def spanning_group(modes: list[str] | None = None) -> GroupRef:
    """Two sessions of a task started at version 3: one over versions 3, 4, 5, 5, one all on
    5 (its log-probs of ``modes`` when given)."""
    one = session(recorded([3, 4, 5, 5]), 0)
    two = session(recorded([5, 5, 5, 5], modes), 1)
    group = summarize("t", [one, two])
    return GroupRef.of(group, "groups/t.json", scored_rewards(group))


def test_the_buffer_keeps_or_drops_a_group_by_its_token_weighted_staleness():
    ref = spanning_group()
    weighted = ref.token_weighted_policy_version
    assert weighted is not None and 4 < weighted < 5
    config = BufferConfig(buffer_id="b", max_staleness=1)
    # at buffer version 5 the token-weighted staleness is below 1: kept, though the task
    # started 2 versions ago (a rule on the start version would drop it)
    assert group_staleness(ref, 3, 5) == pytest.approx(5 - weighted) and 5 - weighted < 1
    assert arrival_drop_reason(ref, 3, 5, config) is None
    # at version 6 it is past 1: dropped as stale
    assert group_staleness(ref, 3, 6) == pytest.approx(6 - weighted) and 6 - weighted > 1
    assert arrival_drop_reason(ref, 3, 6, config) == "stale"
    # control: a group without trainable tokens counts at its start version, 5 - 3 > 1
    no_tokens = ref.model_copy(update={"token_weighted_policy_version": None})
    assert group_staleness(no_tokens, 3, 5) == 2
    assert arrival_drop_reason(no_tokens, 3, 5, config) == "stale"
    # no limit: every group is kept
    assert arrival_drop_reason(ref, 3, 60, BufferConfig(buffer_id="b")) is None


def test_a_buffer_set_to_drop_mixed_log_prob_modes_drops_only_a_mixed_group():
    drop = BufferConfig(buffer_id="b", mixed_logprob_modes="drop")
    mixed = spanning_group(["temperature"] * 4)
    assert mixed.mixed_logprob_modes
    assert arrival_drop_reason(mixed, 3, 5, drop) == "mixed_logprob_modes"
    # handed out (flagged) under the default setting
    assert arrival_drop_reason(mixed, 3, 5, BufferConfig(buffer_id="b")) is None
    # control: a group of one mode is kept under "drop"
    assert arrival_drop_reason(spanning_group(), 3, 5, drop) is None
    # staleness is checked first: a stale mixed group is dropped as stale
    stale_and_mixed = BufferConfig(buffer_id="b", mixed_logprob_modes="drop", max_staleness=0)
    assert arrival_drop_reason(mixed, 3, 6, stale_and_mixed) == "stale"
