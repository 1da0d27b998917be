"""Sessions the policy never answered, or whose task asked too much, get no reward and a
cause that says what happened, on the real stack (Temporal, llama-server, the in-process
fleets, the shell harness on the local runtime; docs/failures.md): a harness that hangs
before its first model call until its run budget (20 s) runs out; a harness whose only call
the gateway refuses (a body over the gateway's 16 MiB limit: 413); an artifact file over the
sandbox's limit (16 MiB)."""

from __future__ import annotations

import pytest

from rolloutd.cli.report import exit_code
from rolloutd.types import SessionStatus
from tests.support.shell_calls import call
from tests.workflows.session.test_failure_sessions import run_all, task

pytestmark = [pytest.mark.temporal, pytest.mark.engine]

#: one chat call whose body is 17 MB, over the gateway's default 16 MiB limit
HUGE_CALL = (
    'python3 -c \'import json; print(json.dumps({"model": "m", "messages": '
    '[{"role": "user", "content": "a" * 17000000}]}))\' > big.json && '
    'curl -sS -f -o reply.json "$OPENAI_BASE_URL/chat/completions" '
    "-H \"Authorization: Bearer $OPENAI_API_KEY\" -H 'Content-Type: application/json' "
    "--data-binary @big.json"
)


@pytest.mark.acceptance
async def test_a_hung_harness_a_refused_call_and_a_huge_artifact_get_no_reward(fleets):
    """About 60 s (the hung harness's 20 s run budget, and 17 MB written twice), plus the
    fleets' start when first. A harness that sleeps before any model call is stopped at its
    run budget: ``harness`` ("no answered model call before its run budget ran out"), not a
    policy-accountable timeout, and not evaluated (``timeout_reward`` "evaluate"). A harness
    whose only call is refused with 413: ``harness``, the cause names the refusal, not
    retryable. A 17 MB artifact file: ``sandbox`` in phase ``collect``, the cause names the
    file and the limit, not retryable. None has a reward; ``submit`` exits 1."""
    hung, refused, huge = await run_all(
        fleets,
        task("hung", "sleep 600", phases={"run_s": 20}, timeout_reward="evaluate"),
        task("refused", HUGE_CALL),
        task(
            "huge",
            f"{call('hi')} && head -c 17000000 /dev/zero > big.bin",
            runtime={"type": "local", "artifacts": ["big.bin"]},
        ),
    )
    [s] = hung.sessions
    assert s.failure is not None and (s.failure.kind, s.failure.phase) == ("harness", "run"), s
    assert not s.failure.policy_accountable
    assert "no answered model call before its run budget ran out" in s.failure.message
    assert s.reward is None and s.status == SessionStatus.FAILED
    assert "evaluate" not in {p.phase for p in s.phases}

    [s] = refused.sessions
    assert s.failure is not None and s.failure.kind == "harness", s
    assert "the gateway refused its call (413 RequestTooLargeError" in s.failure.message
    assert not s.failure.retryable and s.reward is None
    assert s.num_completions == 0

    [s] = huge.sessions
    assert s.failure is not None and (s.failure.kind, s.failure.phase) == ("sandbox", "collect")
    assert "artifact 'big.bin' is 17000000 bytes, over the limit of" in s.failure.message
    assert not s.failure.retryable and s.reward is None
    assert exit_code([hung]) == exit_code([refused]) == exit_code([huge]) == 1
