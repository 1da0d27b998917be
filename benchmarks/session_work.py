"""Per-session work of the gateway and the builders for one long session: 1,000 completions
(20 sub-agent conversations of 50 turns, interleaved, no ``extends`` hint) with 20 failed
calls whose conversations went on without their answers.

    python benchmarks/session_work.py [--completions 1000] [--failures 20] [--conversations 20]

Measured, each alone, in seconds (one thread, wall clock):

- ``record failures``: the session records each failed call as it happens, among the
  completions recorded so far (``Session.record_error``: the open failed calls);
- ``unrecovered at close``: the failed calls no completion made good, read when the session
  closes (``unrecovered_errors``);
- ``replay stats``: what replay did, every completion replayed (``ReplaySource.stats``);
- ``chain plan``: the builders' chain planner over the log (``plan_chains``).

It uses only functions whose signatures did not change, so the same file measures an older
checkout (``PYTHONPATH=<checkout>/src``) for a before/after comparison. On a loaded shared
machine the absolute times move; the growth with ``--completions`` is what matters.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from typing import Any

from rolloutd.proxy.sessions.call_errors import CallError, conversation_hash
from rolloutd.proxy.sessions.replay_source import ReplaySource
from rolloutd.proxy.sessions.session import Session
from rolloutd.proxy.sessions.state import SessionState, unrecovered_errors
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.trajectory.chains import plan_chains
from rolloutd.types import Completion

EOT = 2
#: tokens of one user turn and of one answer
TURN_TOKENS = 6


def build_log(num_completions: int, num_conversations: int) -> list[Completion]:
    """The session's log: conversations interleaved, each turn's prompt the previous prompt,
    answer, end-of-turn and a new user turn (token ids and OpenAI messages alike)."""
    prompts: list[list[int]] = [[] for _ in range(num_conversations)]
    messages: list[list[dict[str, Any]]] = [[] for _ in range(num_conversations)]
    answers: list[tuple[list[int], dict[str, Any]] | None] = [None] * num_conversations
    log = []
    for index in range(num_completions):
        k = index % num_conversations
        base = 1000 * (k + 1) + index
        if answers[k] is not None:
            ids, message = answers[k]  # type: ignore[misc]
            prompts[k] = [*prompts[k], *ids]
            messages[k] = [*messages[k], message]
        user = [base + t for t in range(TURN_TOKENS)]
        prompts[k] = [*prompts[k], *user]
        messages[k] = [*messages[k], {"role": "user", "content": f"step {index} of {k}"}]
        response = [base + 100 + t for t in range(TURN_TOKENS)] + [EOT]
        answer = {"role": "assistant", "content": f"done {index}"}
        answers[k] = (response, answer)
        log.append(
            Completion(
                session_id="bench/0",
                index=index,
                request_hash=f"request-{index}",
                messages=messages[k],
                prompt_ids=prompts[k],
                response_ids=response,
                response_logprobs=[-0.1] * len(response),
                response_message=answer,
                replayed_from=f"bench/old:{index}",
            )
        )
    return log


def failure(at_index: int, messages: list[dict[str, Any]]) -> CallError:
    """A failed call of a conversation whose harness then went on without its answer."""
    asked = [*messages, {"role": "user", "content": f"lost question {at_index}"}]
    return CallError(
        at_index=at_index,
        at=0.0,
        error_type="BackendError",
        message="connection reset",
        status_code=502,
        backend="b",
        duration_s=0.1,
        request_hash=f"failed-{at_index}",
        num_messages=len(asked),
        conversation_hash=conversation_hash(asked),
    )


async def record_failures(
    store: BlobStore, log: list[Completion], num_failures: int
) -> tuple[float, Session]:
    """Replay the session's life: completions appended, a failure recorded every so often."""
    state = SessionState(
        session_id="bench/0", task_id="bench", session_key_sha256="x", model="m", backend="b"
    )
    session = Session(state, [], CompletionLog(store, "bench/0"))
    every = max(1, len(log) // (num_failures + 1))
    spent = 0.0
    for completion in log:
        session.completions.append(completion)
        if completion.index % every == every - 1 and session.state.num_errors < num_failures:
            error = failure(completion.index + 1, completion.messages)
            started = time.perf_counter()
            await session.record_error(error)
            spent += time.perf_counter() - started
    return spent, session


def timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=1000)
    parser.add_argument("--failures", type=int, default=20)
    parser.add_argument("--conversations", type=int, default=20)
    args = parser.parse_args()
    log = build_log(args.completions, args.conversations)
    with tempfile.TemporaryDirectory() as folder:
        store = BlobStore(folder)
        record_s, session = asyncio.run(record_failures(store, log, args.failures))
        close_s, unrecovered = timed(lambda: unrecovered_errors(session.state, log))
        source = ReplaySource(store, [])
        stats_s, stats = timed(lambda: source.stats(log))
        plan_s, plan = timed(lambda: plan_chains(log, end_of_turn_id=EOT))
    assert len(unrecovered) == args.failures, len(unrecovered)
    assert stats.num_replayed == len(log)
    print(
        f"{len(log)} completions, {args.conversations} conversations, "
        f"{session.state.num_errors} failed calls ({len(unrecovered)} unrecovered), "
        f"{len(plan.chains)} chains, {len(stats.ends)} replay ends"
    )
    print("| step | seconds |")
    print("| --- | --- |")
    for name, seconds in (
        ("record failures", record_s),
        ("unrecovered at close", close_s),
        ("replay stats", stats_s),
        ("chain plan", plan_s),
    ):
        print(f"| {name} | {seconds:.3f} |")


if __name__ == "__main__":
    main()
