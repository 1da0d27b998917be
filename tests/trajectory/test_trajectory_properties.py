"""Property tests of the builders over generated sessions and the real Qwen2.5 tokenizer.

The builders' invariants: for every generated session (branches, retries, truncations,
compaction, sub-agents with equal first prompts, a reasoning-stripping template) no completion is
lost or duplicated, every trainable token and logprob is a sampled one, lengths are aligned,
and drift is counted exactly where the generator put it.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from session_generator import generate, scripts

from rolloutd.trajectory import build_traces, check_invariants
from rolloutd.types import BuilderSpec, CaptureMode

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _expected_trainable(log, expected, *, action_only: bool, include_retries: bool) -> int:
    retries = {i for group in expected.retries for i in group}
    total = 0
    for c in log:
        if not c.trainable or (c.index in retries and not include_retries):
            continue
        total += len(c.response_ids)
        if action_only:
            total -= expected.sampled[c.index].num_think
    return total


@SETTINGS
@given(
    script=scripts(),
    on_drift=st.sampled_from(["keep", "split"]),
    loss_mask=st.sampled_from(["full_assistant", "action_only"]),
)
def test_prefix_merging_rebuilds_generated_sessions(
    generator, eot, reasoning, script, on_drift, loss_mask
):
    log, expected = generate(generator, script, split=on_drift == "split")
    spec = BuilderSpec(type="prefix_merging", on_drift=on_drift, loss_mask=loss_mask)
    traces, stats = build_traces(
        log, spec, end_of_turn_id=eot, reasoning_spans=reasoning, verify="full"
    )

    check_invariants(traces, log)
    assert sorted((t.completion_indices, t.retry_indices) for t in traces) == sorted(
        zip(expected.chains, expected.retries, strict=True)
    )
    assert stats.num_completions == len(log)
    assert stats.num_completions == (
        stats.num_chains + stats.num_completions_merged + stats.num_retries_collapsed
    )
    assert stats.num_retries_collapsed == sum(map(len, expected.retries))
    assert stats.num_chain_breaks == expected.num_breaks
    assert stats.num_drift_tokens == sum(d[2] for d in expected.drifts)
    assert stats.num_drift_turns == len(expected.drifts)
    assert stats.num_trainable_tokens == _expected_trainable(
        log, expected, action_only=loss_mask == "action_only", include_retries=False
    )
    if script["mode"] == CaptureMode.TOKENS:
        assert stats.num_drift_tokens == 0

    for trace in traces:
        offsets = dict(zip(trace.completion_indices, trace.response_offsets, strict=True))
        drifts = [d for d in expected.drifts if d[1] in offsets] if on_drift == "keep" else []
        assert trace.num_drift_tokens == sum(d[2] for d in drifts)
        assert trace.drift_positions == sorted(
            offsets[prev] + p for prev, _, _, positions in drifts for p in positions
        )
        for index, offset in offsets.items():  # a length turn gets its eot, untrained
            c = log[index]
            end = offset + len(c.response_ids)
            if not c.end_of_turn_sampled and index != trace.completion_indices[-1]:
                assert trace.response_ids[end] == eot and trace.loss_mask[end] == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=scripts())
def test_sampled_verification_builds_what_full_verification_builds(generator, eot, script):
    log, _ = generate(generator, script, split=True)
    spec = BuilderSpec(type="prefix_merging", on_drift="keep")
    sampled, sampled_stats = build_traces(log, spec, end_of_turn_id=eot, verify="sampled")
    full, full_stats = build_traces(log, spec, end_of_turn_id=eot, verify="full")
    assert sampled == full and sampled_stats == full_stats


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=scripts(), loss_mask=st.sampled_from(["full_assistant", "action_only"]))
def test_per_request_keeps_one_trace_per_completion(generator, eot, reasoning, script, loss_mask):
    log, expected = generate(generator, script, split=True)
    spec = BuilderSpec(type="per_request", loss_mask=loss_mask)
    traces, stats = build_traces(log, spec, end_of_turn_id=None, reasoning_spans=reasoning)
    check_invariants(traces, log)
    assert [t.completion_indices for t in traces] == [[c.index] for c in log]
    assert all(t.num_traces_in_session == len(log) for t in traces)
    assert stats.num_chains == len(log) and stats.num_completions == len(log)
    assert stats.num_trainable_tokens == _expected_trainable(
        log, expected, action_only=loss_mask == "action_only", include_retries=True
    )
