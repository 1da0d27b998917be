"""Unit tests of the builders: the known failure modes of trajectory reconstruction, one by
one, and the checks.

Each test states the field failure it guards against (POLAR's prefix_merging, NeMo Gym's
re-tokenization, OpenClaw-RL's logprob drift) on small logs over the real Qwen2.5 tokenizer.
"""

from __future__ import annotations

import json

import pytest
from session_generator import Answer, Event, generate

from rolloutd.errors import BuilderError
from rolloutd.trajectory import (
    assign_rewards,
    build_traces,
    check_invariants,
    to_polar_trace,
)
from rolloutd.types import BuilderSpec, CaptureMode, Completion, Trace

MERGING = BuilderSpec(type="prefix_merging", on_drift="keep")


def _answer(
    think: tuple[int, ...] = (),
    words: tuple[int, ...] = (0, 1),
    *,
    truncate_at: int | None = None,
    retok: int | None = None,
    trainable: bool = True,
) -> Answer:
    return Answer(
        think_words=think,
        answer_words=words,
        truncate_at=truncate_at,
        retok_word=retok,
        trainable=trainable,
    )


def _script(mode: CaptureMode, *events: Event, strip: bool = False) -> dict:
    return {"mode": mode, "strip": strip, "events": list(events)}


def _turn(agent: int = 0, **kwargs) -> Event:
    return Event(kind="turn", agent=agent, answer=_answer(**kwargs))


def _completion(index: int, prompt: list[int], response: list[int], **kwargs) -> Completion:
    return Completion(
        session_id="s",
        index=index,
        prompt_ids=prompt,
        response_ids=response,
        response_logprobs=[-0.5] * len(response),
        **kwargs,
    )


# ---------------------------------------------------------------- POLAR's failure modes


@pytest.mark.parametrize("mode", [CaptureMode.TOKENS, CaptureMode.PASSTHROUGH])
def test_identical_retry_is_kept_once_and_the_chain_goes_on(generator, eot, mode):
    log, _ = generate(
        generator,
        _script(
            mode, _turn(), Event(kind="retry_same", agent=0, answer=_answer()), _turn(), _turn()
        ),
        split=False,
    )
    traces, stats = build_traces(log, MERGING, end_of_turn_id=eot)
    check_invariants(traces, log)
    assert [(t.completion_indices, t.retry_indices) for t in traces] == [([0, 2, 3], [1])]
    assert stats.num_retries_collapsed == 1 and stats.num_chain_breaks == 0


@pytest.mark.parametrize("mode", [CaptureMode.TOKENS, CaptureMode.PASSTHROUGH])
def test_sub_agents_with_equal_first_prompts_are_separate_chains(generator, eot, mode):
    subagent = Event(kind="subagent", agent=0, answer=_answer(words=(3,)), same_task=True)
    log, _ = generate(
        generator, _script(mode, _turn(), subagent, _turn(0), _turn(1), _turn(1)), split=False
    )
    assert log[0].prompt_ids == log[1].prompt_ids
    traces, stats = build_traces(log, MERGING, end_of_turn_id=eot)
    check_invariants(traces, log)
    assert sorted(t.completion_indices for t in traces) == [[0, 2], [1, 3, 4]]
    assert stats.num_chain_breaks == 1


@pytest.mark.parametrize("mode", [CaptureMode.TOKENS, CaptureMode.PASSTHROUGH])
def test_a_chain_whose_turns_all_end_by_length_stays_one_chain(generator, eot, mode):
    turns = [_turn(words=(i, i + 1, i + 2), truncate_at=2) for i in range(4)]
    log, _ = generate(generator, _script(mode, *turns), split=False)
    assert not any(c.end_of_turn_sampled for c in log)
    traces, stats = build_traces(log, MERGING, end_of_turn_id=eot)
    check_invariants(traces, log)
    (trace,) = traces
    assert trace.completion_indices == [0, 1, 2, 3] and stats.num_length_turns == 4
    for index, offset in zip(trace.completion_indices[:-1], trace.response_offsets, strict=False):
        after = offset + len(log[index].response_ids)  # the inserted end-of-turn token
        assert trace.response_ids[after] == eot and trace.loss_mask[after] == 0


def test_a_reasoning_stripping_template_is_drift_counted_and_located(generator, eot):
    think = (0, 1, 2)
    log, expected = generate(
        generator,
        _script(CaptureMode.PASSTHROUGH, _turn(think=think), _turn(), strip=True),
        split=False,
    )
    num_think = expected.sampled[0].num_think
    kept, kept_stats = build_traces(log, MERGING, end_of_turn_id=eot)
    check_invariants(kept, log)
    (trace,) = kept
    assert trace.num_drift_tokens == kept_stats.num_drift_tokens == num_think
    assert trace.drift_positions == list(range(num_think))  # the sampled <think> block
    split, split_stats = build_traces(log, BuilderSpec(on_drift="split"), end_of_turn_id=eot)
    check_invariants(split, log)
    assert [t.completion_indices for t in split] == [[0], [1]]
    assert split_stats.num_drift_tokens == num_think and split_stats.num_chain_breaks == 1
    assert all(t.num_drift_tokens == 0 for t in split)


def test_retokenized_turn_is_drift_at_the_respelled_word(generator, eot):
    log, expected = generate(
        generator,
        _script(CaptureMode.PASSTHROUGH, _turn(words=(0, 1, 2), retok=1), _turn()),
        split=False,
    )
    (trace,), stats = build_traces(log, MERGING, end_of_turn_id=eot)
    assert trace.drift_positions == expected.sampled[0].retok_positions
    assert stats.num_drift_tokens == len(expected.sampled[0].retok_positions) >= 2


def test_tokens_mode_drift_is_an_error(generator, eot):
    log, _ = generate(generator, _script(CaptureMode.TOKENS, _turn(), _turn()), split=False)
    broken = log[1].model_copy(
        update={"prompt_ids": [log[1].prompt_ids[0] + 1] + log[1].prompt_ids[1:]}
    )
    with pytest.raises(BuilderError, match="drift must be zero in tokens mode"):
        build_traces([log[0], broken], MERGING, end_of_turn_id=eot, verify="full")


def test_extends_must_name_an_earlier_completion(eot):
    log = [_completion(0, [1, 2], [3, eot], extends=1), _completion(1, [1, 2, 3, eot], [eot])]
    with pytest.raises(BuilderError, match="not an earlier completion"):
        build_traces(log, MERGING, end_of_turn_id=eot)


def test_prefix_merging_needs_the_end_of_turn_token(eot):
    log = [_completion(0, [1, 2], [3, eot])]
    with pytest.raises(BuilderError, match="end-of-turn token"):
        build_traces(log, MERGING, end_of_turn_id=None)
    traces, _ = build_traces(log, BuilderSpec(type="per_request"), end_of_turn_id=None)
    assert len(traces) == 1


def test_completions_without_tokens_get_their_own_untrained_trace(eot):
    log = [
        _completion(0, [1, 2], [3, eot]),
        Completion(
            session_id="s",
            index=1,
            capture_mode=CaptureMode.PASSTHROUGH,
            trainable=False,
            response_text="hi",
        ),
        _completion(2, [1, 2, 3, eot, 4], [5, eot]),
    ]
    traces, stats = build_traces(log, MERGING, end_of_turn_id=eot)
    check_invariants(traces, log)
    assert [t.completion_indices for t in traces] == [[0, 2], [1]]
    assert traces[1].loss_mask == [] and traces[1].metadata["chain_start"] == "no_tokens"
    assert stats.num_untrainable_completions == 1


def test_recomputed_logprob_positions_move_to_the_trace(eot):
    # a backend scored the logprob of completion 0's token 1 and completion 1's token 0 again
    log = [
        _completion(0, [1, 2], [3, 4, eot], recomputed_logprob_positions=[1]),
        _completion(1, [1, 2, 3, 4, eot, 6], [7, eot], recomputed_logprob_positions=[0]),
    ]
    [merged], _ = build_traces(log, MERGING, end_of_turn_id=eot)
    check_invariants([merged], log)
    # response_ids: 3 4 eot | 6 | 7 eot
    assert merged.recomputed_logprob_positions == [1, 4]
    assert all(merged.loss_mask[k] for k in merged.recomputed_logprob_positions)
    per_request, _ = build_traces(log, BuilderSpec(type="per_request"), end_of_turn_id=eot)
    assert [t.recomputed_logprob_positions for t in per_request] == [[1], [0]]
    with pytest.raises(ValueError, match="outside"):
        _completion(2, [1], [3], recomputed_logprob_positions=[1])


def test_action_only_masks_reasoning_and_needs_spans(generator, eot, reasoning):
    log, expected = generate(
        generator,
        _script(CaptureMode.TOKENS, _turn(think=(0, 1)), _turn(think=(2,)), _turn()),
        split=False,
    )
    spec = BuilderSpec(loss_mask="action_only")
    (trace,), _ = build_traces(log, spec, end_of_turn_id=eot, reasoning_spans=reasoning)
    check_invariants([trace], log)
    for index, offset in zip(trace.completion_indices, trace.response_offsets, strict=True):
        num_think = expected.sampled[index].num_think
        n = len(log[index].response_ids)
        assert trace.loss_mask[offset : offset + n] == [0] * num_think + [1] * (n - num_think)
    with pytest.raises(BuilderError, match="reasoning_spans"):
        build_traces(log, spec, end_of_turn_id=eot)


# ---------------------------------------------------------------- check_invariants catches


def _built(generator, eot):
    log, _ = generate(
        generator,
        _script(
            CaptureMode.TOKENS,
            _turn(truncate_at=1),
            _turn(),
            _turn(trainable=False),
            Event(kind="retry_same", agent=0, answer=_answer()),
            Event(kind="subagent", agent=0, answer=_answer(), same_task=True),
            _turn(1),
        ),
        split=False,
    )
    traces, _ = build_traces(log, MERGING, end_of_turn_id=eot)
    check_invariants(traces, log)
    return traces, log


def _untrained_context_position(trace: Trace, log: list[Completion]) -> int:
    first = log[trace.completion_indices[0]]
    return len(first.response_ids)  # the inserted end-of-turn token after a length turn


MUTATIONS = {
    "dropped trace": (
        lambda t, log: [setattr(x, "num_traces_in_session", 1) for x in t[:-1]] and t.pop(),
        "in no trace",
    ),
    "duplicated completion": (
        lambda t, log: t[1].completion_indices.__setitem__(0, t[0].completion_indices[0]),
        "also in trace",
    ),
    "mask on inserted token": (
        lambda t, log: t[0].loss_mask.__setitem__(_untrained_context_position(t[0], log), 1),
        "logprobs|not sampled",
    ),
    "mask on tool tokens with logprob": (
        lambda t, log: (
            t[0].loss_mask.__setitem__(_untrained_context_position(t[0], log) + 1, 1),
            t[0].response_logprobs.__setitem__(_untrained_context_position(t[0], log) + 1, -1.0),
        ),
        "not sampled",
    ),
    "wrong logprob": (lambda t, log: t[0].response_logprobs.__setitem__(0, -9.0), "reported"),
    "misaligned": (lambda t, log: t[0].loss_mask.pop(), "must be equal"),
    "wrong session count": (
        lambda t, log: setattr(t[0], "num_traces_in_session", 7),
        "num_traces_in_session",
    ),
    "context differs": (
        lambda t, log: t[0].response_ids.__setitem__(_untrained_context_position(t[0], log) + 1, 0),
        "differs from its prompt",
    ),
    "drift in tokens mode": (lambda t, log: setattr(t[0], "num_drift_tokens", 1), "tokens mode"),
    "mask on untrainable": (
        lambda t, log: (
            t[0].loss_mask.__setitem__(t[0].response_offsets[2], 1)
            or t[0].response_logprobs.__setitem__(
                t[0].response_offsets[2], log[t[0].completion_indices[2]].response_logprobs[0]
            )
        ),
        "untrainable",
    ),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_check_invariants_catches_a_broken_builder(generator, eot, name):
    traces, log = _built(generator, eot)
    mutate, message = MUTATIONS[name]
    mutate(traces, log)
    with pytest.raises(BuilderError, match=message):
        check_invariants(traces, log)


# ---------------------------------------------------------------- rewards and export


def test_rewards_broadcast_or_per_trace_with_the_session_count(generator, eot):
    traces, _ = _built(generator, eot)
    assign_rewards(traces, 1.0, None)
    assert [(t.reward, t.num_traces_in_session) for t in traces] == [(1.0, 2), (1.0, 2)]
    assign_rewards(traces, None, [0.25, 0.75])
    assert [t.reward for t in traces] == [0.25, 0.75]
    with pytest.raises(BuilderError, match="not both"):
        assign_rewards(traces, 1.0, [1.0, 1.0])
    with pytest.raises(BuilderError, match="1 trace rewards for 2 traces"):
        assign_rewards(traces, None, [1.0])


def test_polar_export_has_the_paper_shape(generator, eot):
    traces, _ = _built(generator, eot)
    assign_rewards(traces, 0.5, None)
    exported = to_polar_trace(traces[0])
    assert set(exported) == {
        "prompt_ids",
        "response_ids",
        "loss_mask",
        "response_logprobs",
        "prompt_messages",
        "response_messages",
        "tools",
        "finish_reason",
        "reward",
        "metadata",
    }
    assert (
        len(exported["response_ids"])
        == len(exported["loss_mask"])
        == len(exported["response_logprobs"])
    )
    assert exported["reward"] == 0.5 and exported["metadata"]["num_traces_in_session"] == 2
    assert exported["prompt_messages"][-1]["role"] == "user"
    roles = [m["role"] for m in exported["response_messages"]]
    assert roles[0] == "assistant"
    assert roles.count("assistant") == len(traces[0].completion_indices)
    json.dumps(exported)


# ---------------------------------------------------------------- regressions found by hypothesis


def test_retry_with_another_answer_later_in_a_chain_is_a_branch_not_drift(generator, eot):
    # c3 repeats c2's prompt; c0's prompt is a prefix of it, but c3 follows c1's answer, not c0's
    retry = Event(kind="retry_diff", agent=0, answer=_answer(words=(5,)))
    log, _ = generate(
        generator, _script(CaptureMode.PASSTHROUGH, _turn(), retry, _turn(), retry), split=False
    )
    traces, stats = build_traces(log, MERGING, end_of_turn_id=eot)
    check_invariants(traces, log)
    assert sorted(t.completion_indices for t in traces) == [[0], [1, 2], [3]]
    assert stats.num_drift_tokens == 0 and stats.num_chain_breaks == 2


def test_an_answer_without_tokens_is_not_taken_for_drift_of_a_sibling(generator, eot):
    # a sub-agent answers first; the main agent's first call has no token ids; the main agent's
    # next prompt starts with the sub-agent's prompt, but message history names its real parent
    subagent = Event(kind="subagent", agent=0, answer=_answer(), same_task=True)
    opaque = Event(kind="opaque", agent=0, answer=_answer(words=(4,)))
    log, _ = generate(
        generator, _script(CaptureMode.PASSTHROUGH, subagent, opaque, _turn(0)), split=False
    )
    traces, stats = build_traces(log, MERGING, end_of_turn_id=eot)
    check_invariants(traces, log)
    assert sorted(t.completion_indices for t in traces) == [[0], [1], [2]]
    assert stats.num_drift_tokens == 0


def test_stats_list_the_policy_versions_the_session_ran_on(eot):
    # weights moved between the two calls of one chain: the group records both versions
    log = [
        _completion(0, [1, 2], [3, eot], policy_version=4),
        _completion(1, [1, 2, 3, eot, 5], [6, eot], policy_version=5),
        _completion(2, [9], [8, eot], policy_version=4),
    ]
    _, stats = build_traces(log, MERGING, end_of_turn_id=eot)
    assert stats.policy_versions == [4, 5]
    assert build_traces([], MERGING, end_of_turn_id=eot)[1].policy_versions == []
