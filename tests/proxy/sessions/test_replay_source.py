"""The replay source's bookkeeping (rolloutd.proxy.sessions.replay_source), on logs written to a
real blob store: what is offered across several earlier attempts, in which order, how ``extends`` is
remapped, what staleness passes over, and where each conversation's replay ended."""

from __future__ import annotations

from pathlib import Path

from rolloutd.proxy.sessions.replay_source import ReplaySource, completion_key, replayed_copy
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.types import Completion


def conversation(
    session_id: str, keys: list[str], *, version: int = 0, start: int = 0, root: int | None = None
) -> list[Completion]:
    """One conversation's completions: request ``keys[i]`` extends the one before."""
    out = []
    for i, key in enumerate(keys):
        index = start + i
        extends = (index - 1) if i else root
        out.append(
            Completion(
                session_id=session_id,
                index=index,
                request_hash=key,
                messages=[{"role": "user", "content": k} for k in keys[: i + 1]],
                prompt_ids=[1, 2, 3],
                response_ids=[7, 8],
                response_logprobs=[-0.1, -0.2],
                extends=extends,
                policy_version=version,
                response_id=f"chatcmpl-{key}",
            )
        )
    return out


def write(store: BlobStore, completions: list[Completion]) -> None:
    for completion in completions:
        CompletionLog(store, completion.session_id).append(completion)


def copies(completions: list[Completion], session_id: str) -> list[Completion]:
    """``completions`` as attempt ``session_id`` records them when it replays each one."""
    return [
        replayed_copy(
            c,
            session_id=session_id,
            index=c.index,
            extends=c.extends,
            request={},
            body_hash=c.request_hash,
            response_id=c.response_id,
        )
        for c in completions
    ]


async def test_offers_each_earlier_completion_once_across_attempts(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    write(store, conversation("s", ["a", "b", "c", "d"]))
    # attempt 2 replayed a and b, then sampled x
    second = copies(conversation("s", ["a", "b"]), "s.attempt-2")
    second += conversation("s.attempt-2", ["x"], start=2, root=1)
    write(store, second)

    source = ReplaySource(store, ["s.attempt-2", "s"])
    await source.ensure_loaded([])
    # a and b offered as attempt 2's copies; c and d (not consumed) from attempt 1
    assert [completion_key(c) for c in source.offered] == [
        "s.attempt-2#0",
        "s.attempt-2#1",
        "s.attempt-2#2",
        "s#2",
        "s#3",
    ]
    a = source.take("a", 0)
    assert a is not None and completion_key(a) == "s.attempt-2#0"
    assert source.take("a", 0) is None  # taken once
    source.placed(a, 0)
    b = source.take("b", 0)
    assert b is not None and source.remap(b) == 0
    source.placed(b, 1)
    c = source.take("c", 0)  # attempt 1's c continues b, which attempt 2's copy replayed
    assert c is not None and completion_key(c) == "s#2" and source.remap(c) == 1
    source.release(c)
    assert source.take("c", 0) is c


async def test_a_restart_reads_the_position_from_replayed_from(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    write(store, conversation("s", ["a", "b", "c"]))
    own = copies(conversation("s", ["a", "b"]), "s.attempt-2")
    source = ReplaySource(store, ["s"])
    await source.ensure_loaded(own)
    assert source.take("a", 0) is None and source.take("b", 0) is None
    c = source.take("c", 0)
    assert c is not None and source.remap(c) == 1


async def test_staleness(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    write(store, conversation("s", ["a"], version=3))
    strict = ReplaySource(store, ["s"], max_staleness=0)
    await strict.ensure_loaded([])
    assert strict.take("a", 4) is None and strict.stale == {"s#0"}
    lenient = ReplaySource(store, ["s"], max_staleness=1)
    await lenient.ensure_loaded([])
    assert lenient.take("a", 4) is not None


async def test_stats_say_where_each_conversation_ended(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    # two conversations in attempt 1's log: m1 (0), k1 (1: a sub-agent's one call),
    # m2 (2, extends 0), m3 (3, extends 2)
    [m1, m2, m3] = conversation("s", ["m1", "m2", "m3"])
    [k1] = conversation("s", ["k1"], start=1)
    write(
        store,
        [
            m1,
            k1,
            m2.model_copy(update={"index": 2, "extends": 0}),
            m3.model_copy(update={"index": 3, "extends": 2}),
        ],
    )
    source = ReplaySource(store, ["s"])
    await source.ensure_loaded([])
    log = []
    for key in ["m1", "k1"]:  # then m2's request differs: sampled; k1 was its source's last
        taken = source.take(key, 0)
        assert taken is not None
        copy = replayed_copy(
            taken,
            session_id="n",
            index=len(log),
            extends=source.remap(taken),
            request={},
            body_hash=key,
            response_id=taken.response_id,
        )
        source.placed(taken, copy.index)
        log.append(copy)
    stats = source.stats(log)
    assert (stats.num_replayed, stats.num_source_completions, stats.num_not_replayed) == (2, 4, 2)
    assert [(e.last_index, e.source, e.reason) for e in stats.ends] == [
        (0, "s#0", "body_differed"),
        (1, "s#1", "source_ended"),
    ]
    assert stats.num_response_tokens_saved == 4 and stats.num_prompt_tokens_saved == 6


def test_the_continued_replayed_completions_are_found_in_one_pass() -> None:
    """The one-pass rule agrees with comparing every pair (``_continues``) on a log with
    conversations continued by ``extends``, by message history (an answer sent back, a tool
    call's id), a sibling that repeats the messages with another answer, and a conversation
    that stops."""
    from rolloutd.proxy.sessions.replay_source import _continued, _continues
    from rolloutd.types import Completion

    def turn(i: int, messages: list, answer: dict, extends: int | None = None) -> Completion:
        return Completion(
            session_id="s",
            index=i,
            request_hash=f"h{i}",
            messages=messages,
            response_message=answer,
            extends=extends,
            replayed_from=f"src/{i}",
        )

    user = [{"role": "user", "content": "go"}]
    a0 = {"role": "assistant", "content": "first"}
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function"}]}
    log = [
        turn(0, user, a0),
        turn(1, [*user, a0, {"role": "user", "content": "more"}], call),
        turn(2, user, {"role": "assistant", "content": "other"}),  # a sibling of 0
        turn(3, [*user, a0, {"role": "user", "content": "more"}, call], a0),  # continues 1
        turn(4, [{"role": "user", "content": "alone"}], a0),
        turn(5, [], a0, extends=4),  # by the hint
        turn(6, [*user, {"role": "assistant", "content": "other"}], a0),  # continues 2
    ]
    pairwise = {e.index for e in log if any(_continues(o, e) for o in log if o.index > e.index)}
    assert _continued(log) == pairwise == {0, 1, 2, 4}
