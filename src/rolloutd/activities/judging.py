"""Judge-queue activities (``rolloutd-judge``, eval fleet): score stored sessions with an LLM
judge, through a judge session the workflow opened at the gateway, and write the rewards into
the stored trajectories.

``judge`` reads the trajectories, builds the rubric's prompts (:mod:`rolloutd.evaluators.judge`),
calls the judge session's ``/v1/chat/completions`` (the gateway records each call in the judge
session's completion log, untrainable, on the judge pool), parses the answers, and writes each
session's reward, evaluation record (with its judge cost) and, for a per-turn rubric, its
turn rewards. What fails is typed:

- the judge pool gives no answer (refused, 5xx, a call past ``judge.timeout_s``): raises
  ``JudgeUnavailableError`` (retryable): Temporal tries the judging again, up to
  ``judge.max_attempts``; then the workflow writes the failure (``judge_failed``) and the
  session has no reward, an ``evaluator`` cause in phase ``judge``;
- the judge answers, but not in the rubric's schema: it is asked again with the parse error,
  up to ``judge.max_parse_attempts`` calls; then the verdict is the rubric's minimum, the cause
  named in the record's reason (the policy can aim a trajectory at the judge; the pool answered);
- the gateway answers 429 with ``Retry-After`` (the judge pool's token quota is spent,
  :mod:`rolloutd.proxy.backends.quota`): the call waits that long and asks again, never a
  failure (the wait is in the judge cost's ``quota_wait_s``);
- the judge says the prompt exceeds its context (HTTP 400 naming the context): the prompt
  budget is halved and the judging planned again (more chunks, shorter middles), at most
  :data:`MAX_HALVINGS` times.

Re-running ``judge`` on the same input (a retry) asks the same requests again; those the
judge session recorded are answered from its log, not sampled again.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import httpx
import structlog
from temporalio import activity

from rolloutd.activities.heartbeat import heartbeating
from rolloutd.activities.models import (
    JudgedSession,
    JudgeFailedInput,
    JudgeInput,
    JudgeOutput,
)
from rolloutd.activities.names import JUDGE, JUDGE_FAILED
from rolloutd.errors import (
    EvaluatorError,
    JudgeParseError,
    JudgeUnavailableError,
    to_application_error,
)
from rolloutd.evaluators import evaluator_version, get_evaluator
from rolloutd.evaluators import judge as judging
from rolloutd.http_client import BACKEND_CALL, new_async_client
from rolloutd.observability import metrics
from rolloutd.rubrics import JudgeSpec, Rubric
from rolloutd.scoring import judge_failure
from rolloutd.store import BlobStore
from rolloutd.trajectory import assign_rewards
from rolloutd.types import (
    EvaluationRecord,
    JudgeCost,
    SessionStatus,
    Trajectory,
)

log = structlog.get_logger(__name__)

#: the longest wait for the judge pool's token quota before asking again, s
QUOTA_WAIT_MAX_S = 60.0
#: times a judging's prompt budget is halved when the judge says it exceeds its context
MAX_HALVINGS = 4
#: the words of a backend's 400 answer that mean "the prompt exceeds the context"
#: (llama-server: "the request exceeds the available context size"; vLLM: "maximum context
#: length"; OpenAI: "context_length_exceeded")
_CONTEXT_WORDS = ("context", "too long", "maximum length")


class _ContextExceeded(Exception):
    """The judge refused a prompt as longer than its context."""


class _Calls:
    """One judging's calls to its judge session, and what they cost."""

    def __init__(self, http: httpx.AsyncClient, input: JudgeInput, spec: JudgeSpec) -> None:
        self.http = http
        self.input = input
        self.spec = spec
        self.cost = JudgeCost()

    async def call(self, messages: list[dict[str, Any]]) -> str:
        """One judge call: the answer's text.

        Raises:
            JudgeUnavailableError: no answer (refused, timed out, 5xx, any other refusal
                that is not a context overflow).
            _ContextExceeded: the prompt is longer than the judge's context.
        """
        body = {
            "model": self.spec.model or "judge",
            "messages": messages,
            "temperature": self.spec.temperature,
            "max_tokens": self.spec.max_tokens,
            "stream": False,
        }
        url = self.input.base_url.rstrip("/") + "/chat/completions"
        while True:
            response = await self._post(url, body)
            if response.status_code != 429 or "retry-after" not in response.headers:
                break
            # the judge pool's token quota is spent: wait as the gateway says, not a failure
            wait_s = min(QUOTA_WAIT_MAX_S, max(0.1, float(response.headers["retry-after"])))
            self.cost.quota_wait_s = round(self.cost.quota_wait_s + wait_s, 3)
            log.info("judge_quota_wait", wait_s=wait_s)
            await asyncio.sleep(wait_s)
        if response.status_code == 400 and any(w in response.text.lower() for w in _CONTEXT_WORDS):
            raise _ContextExceeded(response.text[:300])
        if response.status_code != 200:
            raise JudgeUnavailableError(
                f"judge answered {response.status_code}: {response.text[:300]}"
            )
        try:
            data = response.json()
            text = judging.content_text(data["choices"][0]["message"].get("content"))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            raise JudgeUnavailableError(f"judge answer is not a chat completion: {e}") from e
        usage = data.get("usage") or {}
        self.cost.num_calls += 1
        self.cost.num_prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.cost.num_response_tokens += int(usage.get("completion_tokens") or 0)
        return text

    async def _post(self, url: str, body: dict[str, Any]) -> httpx.Response:
        """One POST to the judge session.

        Raises:
            JudgeUnavailableError: no answer (refused, timed out).
        """
        began = time.monotonic()
        try:
            return await self.http.post(
                url,
                json=body,
                headers={"Authorization": f"Bearer {self.input.session_key}"},
                timeout=self.spec.timeout_s,
            )
        # not chained: the failure's text (what a session's cause says) is this one, not the
        # transport's innermost error
        except httpx.TimeoutException as e:
            raise JudgeUnavailableError(
                f"judge call timed out after {self.spec.timeout_s:g} s ({type(e).__name__})"
            ) from None
        except httpx.TransportError as e:
            raise JudgeUnavailableError(f"judge unreachable: {type(e).__name__}: {e}") from None
        finally:
            metrics.observe_judge_call(time.monotonic() - began)

    async def verdict(
        self, rubric: Rubric, prompt: str, keys: list[str] | None, key_name: str = "id"
    ) -> tuple[dict[str, dict[str, float]] | None, str | None]:
        """The parsed scores of one prompt, asking again with the parse error while the
        answer does not follow the schema.

        Returns:
            ``(scores, None)``, or ``(None, why)`` after ``max_parse_attempts`` calls.
        """
        messages = judging.messages_for(rubric, prompt)
        why = ""
        for _ in range(self.spec.max_parse_attempts):
            answer = await self.call(messages)
            try:
                return judging.parse_scores(rubric, answer, keys, key_name), None
            except JudgeParseError as e:
                why = str(e)
                messages = [
                    *messages,
                    {"role": "assistant", "content": answer},
                    {
                        "role": "user",
                        "content": f"That answer does not follow the format ({why}). "
                        + judging.answer_format(rubric, keys, key_name),
                    },
                ]
        return None, (
            f"the judge's answer did not parse after {self.spec.max_parse_attempts} "
            f"call(s): {why}; scored the rubric's minimum"
        )


def _scores_text(scores: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in scores.items())


class JudgeActivities:
    """The judge queue's activities, with the blob store and one HTTP client.

    Args:
        store: the blob store holding trajectories.
        transport: the HTTP transport to the gateway (tests), or None.
    """

    def __init__(self, store: BlobStore, transport: httpx.AsyncBaseTransport | None = None):
        self.store = store
        self.http = new_async_client(BACKEND_CALL, transport=transport)
        #: judgings running in this process now, and the most at once (the concurrency bound)
        self.num_running = 0
        self.max_running = 0

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.http.aclose()

    @activity.defn(name=JUDGE)
    async def judge(self, input: JudgeInput) -> JudgeOutput:
        """Judge the input's sessions and write their rewards (module docstring).

        Raises:
            temporalio.exceptions.ApplicationError: ``JudgeUnavailableError`` (retryable)
                when the judge pool gave no answer; ``EvaluatorError`` (not retryable) for a
                spec that is not a judge's or a context that stays exceeded.
        """
        structlog.contextvars.bind_contextvars(
            task_id=input.task_id,
            session_id=input.targets[0].session_id,
            attempt=activity.info().attempt if activity.in_activity() else 1,
        )
        self.num_running += 1
        self.max_running = max(self.max_running, self.num_running)
        metrics.set_judgings_running(self.num_running)
        try:
            async with heartbeating(phase="judge"):
                return await self._judge(input)
        except Exception as e:
            log.warning("judging_failed", error=f"{type(e).__name__}: {e}"[:500])
            raise to_application_error(e) from e
        finally:
            self.num_running -= 1
            metrics.set_judgings_running(self.num_running)

    async def _judge(self, input: JudgeInput) -> JudgeOutput:
        spec = input.evaluator.judge
        if spec is None:
            raise EvaluatorError("evaluator.judge is missing: not a judge's spec")
        version = evaluator_version(get_evaluator(input.evaluator))
        trajectories = [
            await asyncio.to_thread(self.store.get_model, t.trajectory_ref, Trajectory)
            for t in input.targets
        ]
        began = time.monotonic()
        budget = spec.max_prompt_chars
        for _ in range(MAX_HALVINGS + 1):
            calls = _Calls(self.http, input, spec)
            try:
                verdicts = await self._verdicts(calls, spec, trajectories, budget)
                turn_rewards = (
                    [await self._turns(calls, spec, t, budget) for t in trajectories]
                    if spec.per_turn
                    else [None] * len(trajectories)
                )
                break
            except _ContextExceeded as e:
                log.info("judge_context_exceeded", max_prompt_chars=budget, answer=str(e)[:200])
                budget //= 2
        else:
            raise EvaluatorError(
                f"the judge refused every prompt as too long, down to {budget * 2} characters"
            )
        calls.cost.duration_s = round(time.monotonic() - began, 3)
        n = len(trajectories)
        share = JudgeCost(
            num_calls=calls.cost.num_calls if n == 1 else -(-calls.cost.num_calls // n),
            num_prompt_tokens=calls.cost.num_prompt_tokens // n,
            num_response_tokens=calls.cost.num_response_tokens // n,
            duration_s=calls.cost.duration_s,
            quota_wait_s=calls.cost.quota_wait_s,
        )
        out = JudgeOutput(cost=calls.cost)
        for target, trajectory, (reward, reason), turn in zip(
            input.targets, trajectories, verdicts, turn_rewards, strict=True
        ):
            record = EvaluationRecord(
                evaluator=input.evaluator.type,
                version=version,
                reward=reward,
                reason=reason[:2000],
                judge_cost=share,
                source=input.source,
                evaluated_at=time.time(),
            )
            self._write(trajectory, target.trajectory_ref, reward, record, input.rescore, turn)
            out.judged.append(
                JudgedSession(session_id=target.session_id, reward=reward, evaluation=record)
            )
        metrics.count_judge_cost(calls.cost)
        log.info(
            "sessions_judged",
            num_sessions=n,
            num_calls=calls.cost.num_calls,
            duration_s=calls.cost.duration_s,
        )
        return out

    async def _verdicts(
        self, calls: _Calls, spec: JudgeSpec, trajectories: list[Trajectory], budget: int
    ) -> list[tuple[float, str]]:
        """Each trajectory's reward and reason: one call each (``sample``), or the group in
        chunks (``group``)."""
        rubric = spec.rubric
        nonce = secrets.token_hex(8)
        if spec.mode == "sample":
            out = []
            for trajectory in trajectories:
                prompt, elided = judging.sample_prompt(rubric, trajectory, nonce, budget)
                scores, why = await calls.verdict(rubric, prompt, None)
                if scores is None:
                    out.append((0.0, why or "unparsed"))
                    continue
                note = " (the trajectory's middle elided to fit the judge)" if elided else ""
                out.append((rubric.reward(scores[""]), _scores_text(scores[""]) + note))
            return out
        return await self._group_verdicts(calls, rubric, trajectories, budget, nonce)

    async def _group_verdicts(
        self,
        calls: _Calls,
        rubric: Rubric,
        trajectories: list[Trajectory],
        budget: int,
        nonce: str,
    ) -> list[tuple[float, str]]:
        """A group's rewards, judged in chunks on one scale: the first chunk whose answer
        parses is the reference; each later chunk shows its highest- and lowest-rewarded
        samples again (anchors, :func:`rolloutd.evaluators.judge.anchors_of`) beside its new
        ones, and its rewards are mapped onto the reference's scale through them
        (:func:`rolloutd.evaluators.judge.link`). An anchor keeps its reference reward."""
        spec = calls.spec
        verdicts: list[tuple[float, str]] = [(0.0, "")] * len(trajectories)
        reference: dict[int, float] = {}
        left = list(range(len(trajectories)))
        number = 0
        while left:
            number += 1
            anchors = (
                judging.anchors_of(reference, judging.num_anchors(spec.group_chunk_size))
                if reference
                else []
            )
            fresh, left = (
                left[: spec.group_chunk_size - len(anchors)],
                left[spec.group_chunk_size - len(anchors) :],
            )
            ids, prompt = judging.group_prompt(
                rubric, trajectories, [*fresh, *anchors], nonce, budget
            )
            scores, why = await calls.verdict(rubric, prompt, ids)
            where = f"group chunk {number}"
            if scores is None:
                for position in fresh:
                    verdicts[position] = (0.0, f"{where}: {why}")
                continue
            raw = {
                p: rubric.reward(scores[sid])
                for p, sid in zip([*fresh, *anchors], ids, strict=True)
            }
            linked = judging.Link()
            if anchors:
                linked = judging.link([reference[a] for a in anchors], [raw[a] for a in anchors])
            anchor_ids = ids[len(fresh) :]
            for position, sid in zip(fresh, ids, strict=False):
                text = f"{where} as {sid}: {_scores_text(scores[sid])}"
                if anchors:
                    text += (
                        f" (raw {raw[position]:.4f}, linked {linked.text()} through anchors "
                        f"{', '.join(anchor_ids)})"
                    )
                verdicts[position] = (linked(raw[position]), text)
            if not reference:
                reference = {p: raw[p] for p in fresh}
        return verdicts

    async def _turns(
        self, calls: _Calls, spec: JudgeSpec, trajectory: Trajectory, budget: int
    ) -> dict[int, float]:
        """Each assistant turn's reward, by completion index (an unparsed chunk's turns get
        the rubric's minimum)."""
        rubric = spec.rubric
        nonce = secrets.token_hex(8)
        out: dict[int, float] = {}
        first = 0
        for turns, prompt in judging.turn_prompts(
            rubric, trajectory, nonce, budget, spec.turn_chunk_size
        ):
            keys = [str(first + k + 1) for k in range(len(turns))]
            scores, _ = await calls.verdict(rubric, prompt, keys, key_name="turn")
            for key, turn in zip(keys, turns, strict=True):
                out[turn.completion_index] = rubric.reward(scores[key]) if scores else 0.0
            first += len(turns)
        return out

    def _write(
        self,
        trajectory: Trajectory,
        ref: str,
        reward: float,
        record: EvaluationRecord,
        rescore: bool,
        turn_rewards: dict[int, float] | None,
    ) -> None:
        """Write a verdict into the stored trajectory: its reward and record (a re-judging
        appends its record, and gives its reward only to a session that had none because its
        judging had failed)."""
        if turn_rewards is not None:
            for trace in trajectory.traces:
                trace.turn_rewards = [turn_rewards.get(i) for i in trace.completion_indices]
        if rescore:
            trajectory.rescores.append(record)
            failure = trajectory.failure
            judge_failed = (
                failure is not None and failure.kind == "evaluator" and failure.phase == "judge"
            )
            # a reward handed out is never rewritten, and a session failed for another
            # reason (the infrastructure's, before judging) never gets one
            if trajectory.reward is not None or (failure is not None and not judge_failed):
                self.store.put_json(ref, trajectory)
                return
            if judge_failed:
                trajectory.failure = None
                trajectory.status = SessionStatus.COMPLETED
        trajectory.reward = reward
        assign_rewards(trajectory.traces, reward, None)
        trajectory.evaluation = record
        self.store.put_json(ref, trajectory)

    @activity.defn(name=JUDGE_FAILED)
    async def judge_failed(self, input: JudgeFailedInput) -> None:
        """Write a judging given up into its stored trajectories: an ``evaluator`` cause in
        phase ``judge``, an evaluation record with the error, no reward (a re-judging's
        failure is appended to ``rescores`` and changes nothing else)."""

        def write() -> None:
            version = evaluator_version(get_evaluator(input.evaluator))
            for target in input.targets:
                trajectory = self.store.get_model(target.trajectory_ref, Trajectory)
                record = EvaluationRecord(
                    evaluator=input.evaluator.type,
                    version=version,
                    error=input.message[:2000],
                    source="judge",
                    evaluated_at=time.time(),
                )
                if input.rescore:
                    trajectory.rescores.append(record)
                else:
                    trajectory.status = SessionStatus.FAILED
                    trajectory.failure = judge_failure(input.message)
                    trajectory.evaluation = record
                self.store.put_json(target.trajectory_ref, trajectory)

        try:
            await asyncio.to_thread(write)
        except Exception as e:
            raise to_application_error(e) from e
