"""The LLM judge (``llm_judge``): what it shows the judge model and how it reads the answer.

The judging itself runs on the eval fleet's judge queue (``rolloutd-judge``), calling the judge
pool through the gateway in a judge session (:mod:`rolloutd.activities.judging`); this module is
pure: it turns stored trajectories into prompts (:func:`sample_prompt`, :func:`group_prompt`,
:func:`turn_prompts`) and answers into scores (:func:`parse_scores`), by the task's rubric
(:class:`rolloutd.rubrics.Rubric`), and a group's chunks onto one scale (:func:`anchors_of`,
:func:`link`: common-item linking through anchor samples).

What the policy wrote reaches the judge only as delimited, untrusted data: each piece is
wrapped in ``<untrusted-data id="{nonce}">`` ... ``</untrusted-data id="{nonce}">`` with a
nonce drawn per judging, and the marker's name is broken inside the data, so a trajectory
cannot close its own block (the system prompt tells the judge never to follow what is inside).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from rolloutd.errors import EvaluatorError, JudgeParseError
from rolloutd.evaluators.base import EvaluationContext, EvaluationOutcome, Evaluator
from rolloutd.final_state import FinalStateParts
from rolloutd.rubrics import (  # noqa: F401 - num_anchors, num_group_chunks: re-exported
    JUDGE_EVALUATOR,
    JudgeSpec,
    Rubric,
    num_anchors,
    num_group_chunks,
)
from rolloutd.types import EvaluatorSpec, Trajectory

#: the delimiter's tag name; inside data it is written with an underscore instead
MARKER = "untrusted-data"
#: what replaces an elided middle: ``{n}`` characters left out
ELIDED = "\n[... {n} characters elided to fit the judge's context ...]\n"
#: letters naming a group's samples to the judge (then ``S27``, ``S28``, ...)
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class LlmJudge(Evaluator):
    """The registry entry of the LLM judge: its name, revision and final-state needs.

    The judge scores the stored trajectory (never the runtime), so it needs no final state,
    and it is never run by the ``evaluate`` activity: the session and task workflows route a
    task whose ``evaluator.type`` is ``llm_judge`` to the judge queue.
    """

    name = JUDGE_EVALUATOR
    revision = 1

    def __init__(self, spec: EvaluatorSpec) -> None:
        super().__init__(spec)
        if spec.judge is None:
            raise EvaluatorError("evaluator.judge is required for llm_judge")
        self.judge: JudgeSpec = spec.judge

    def final_state(self) -> FinalStateParts:
        """Nothing of the workspace: the judge reads the stored trajectory."""
        return FinalStateParts(kind="files", files=[])

    def revision_detail(self) -> str:
        """The rubric's name, version and digest: a changed rubric is a new version."""
        return self.judge.version()

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """Never called: judging runs on the judge queue.

        Raises:
            EvaluatorError: always.
        """
        raise EvaluatorError(
            "llm_judge scores on the judge queue (rolloutd-judge), not in the evaluate activity"
        )


# --------------------------------------------------------------------------- views


@dataclasses.dataclass
class View:
    """What a judge is shown of one session, as text (each piece still undelimited)."""

    instruction: str
    messages: str
    tool_outputs: str
    final_answer: str


def content_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text") or part.get("content") or ""))
            else:
                parts.append(str(part))
        return "\n".join(p for p in parts if p)
    return "" if content is None else str(content)


def message_text(message: dict[str, Any]) -> str:
    """One message as ``role: text`` (tool calls as their JSON)."""
    text = content_text(message.get("content"))
    calls = message.get("tool_calls")
    if calls:
        text = (text + "\n" if text else "") + "tool calls: " + json.dumps(calls)[:4000]
    return f"{message.get('role', '?')}: {text}"


def conversation(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The session's longest conversation: the messages of the trace with the most of them
    (prompt, then response messages)."""
    if not trajectory.traces:
        return []
    trace = max(trajectory.traces, key=lambda t: len(t.prompt_messages) + len(t.response_messages))
    return [*trace.prompt_messages, *trace.response_messages]


def view(trajectory: Trajectory) -> View:
    """What a judge is shown of ``trajectory``: the first user message (the instruction),
    every message, the tool outputs, and the last assistant message (the final answer)."""
    messages = conversation(trajectory)
    users = [m for m in messages if m.get("role") == "user"]
    assistants = [m for m in messages if m.get("role") == "assistant"]
    tools = [m for m in messages if m.get("role") == "tool"]
    return View(
        instruction=content_text(users[0].get("content")) if users else "",
        messages="\n\n".join(message_text(m) for m in messages if m.get("role") != "system"),
        tool_outputs="\n\n".join(content_text(m.get("content")) for m in tools) or "(none)",
        final_answer=content_text(assistants[-1].get("content")) if assistants else "(none)",
    )


def delimited(text: str, nonce: str) -> str:
    """``text`` as untrusted data: wrapped in the nonce's markers, the marker's name broken
    inside it."""
    clean = re.sub(MARKER, MARKER.replace("-", "_"), text, flags=re.IGNORECASE)
    return f'<{MARKER} id="{nonce}">\n{clean}\n</{MARKER} id="{nonce}">'


def elide(text: str, budget: int) -> str:
    """``text`` within ``budget`` characters: its head and tail, the middle left out and
    said so."""
    if len(text) <= budget:
        return text
    keep = max(0, budget - len(ELIDED) - 8)
    head, tail = keep * 2 // 3, keep - keep * 2 // 3
    return text[:head] + ELIDED.format(n=len(text) - head - tail) + text[len(text) - tail :]


# --------------------------------------------------------------------------- prompts


def criteria_text(rubric: Rubric) -> str:
    """The rubric's criteria as a list for the prompt."""
    return "\n".join(f"- {c.name} (weight {c.weight:g}): {c.description}" for c in rubric.criteria)


def answer_format(rubric: Rubric, keys: list[str] | None = None, key_name: str = "id") -> str:
    """The instruction that states the answer's schema: scores per criterion, under each of
    ``keys`` when given (a group's sample ids, a chunk's turn numbers)."""
    lo, hi = rubric.scale_min, rubric.scale_max
    names = [c.name for c in rubric.criteria]
    if rubric.output == "tag":
        example = " ".join(
            "<score" + (f' {key_name}="{k}"' if k else "") + f' name="{n}">N</score>'
            for k in (keys or [""])
            for n in names
        )
        return (
            f"Answer with one tag per score and nothing else, N an integer from {lo} to {hi}: "
            f"{example}"
        )
    inner = "{" + ", ".join(f'"{n}": N' for n in names) + "}"
    shape = inner if keys is None else "{" + ", ".join(f'"{k}": {inner}' for k in keys) + "}"
    return (
        f"Answer with one JSON object and nothing else, each N an integer from {lo} to {hi}: "
        f"{shape}"
    )


def messages_for(rubric: Rubric, user: str) -> list[dict[str, Any]]:
    """The chat messages of one judge call."""
    return [{"role": "system", "content": rubric.system}, {"role": "user", "content": user}]


def sample_prompt(
    rubric: Rubric, trajectory: Trajectory, nonce: str, max_chars: int
) -> tuple[str, bool]:
    """The prompt judging one session, within ``max_chars`` characters where it can be:
    a long conversation and long tool outputs lose their middle first, then the final answer
    and the instruction theirs.

    Returns:
        The prompt, and whether anything was elided.
    """
    v = view(trajectory)
    fixed = dict(
        criteria=criteria_text(rubric),
        scale_min=rubric.scale_min,
        scale_max=rubric.scale_max,
        answer_format=answer_format(rubric),
    )
    pieces = {
        "instruction": v.instruction,
        "messages": v.messages,
        "tool_outputs": v.tool_outputs,
        "final_answer": v.final_answer,
    }

    def render(p: dict[str, str]) -> str:
        return rubric.template.format(**fixed, **{k: delimited(t, nonce) for k, t in p.items()})

    prompt = render(pieces)
    if len(prompt) <= max_chars:
        return prompt, False
    overhead = len(render({k: "" for k in pieces}))
    room = max(400, max_chars - overhead)
    shares = {"instruction": 0.2, "final_answer": 0.25, "messages": 0.35, "tool_outputs": 0.2}
    short = {k: elide(t, int(room * shares[k])) for k, t in pieces.items()}
    return render(short), True


def sample_id(position: int) -> str:
    """The id a group's sample is shown under: ``A`` .. ``Z``, then ``S27`` ..."""
    return _LETTERS[position] if position < len(_LETTERS) else f"S{position + 1}"


def group_prompt(
    rubric: Rubric,
    trajectories: list[Trajectory],
    positions: list[int],
    nonce: str,
    max_chars: int,
) -> tuple[list[str], str]:
    """The prompt judging one chunk of a group: the samples at ``positions`` (in that order,
    shown as ``A``, ``B``, ...), sharing what is left of ``max_chars`` (a sample's final answer
    and conversation lose their middle to fit).

    Returns:
        ``(ids, prompt)``: the id each position is shown under, in order, and the prompt.
    """
    instruction = view(trajectories[0]).instruction if trajectories else ""
    ids = [sample_id(k) for k in range(len(positions))]
    fmt = answer_format(rubric, ids)

    def render(samples: str) -> str:
        return rubric.group_template.format(
            criteria=criteria_text(rubric),
            scale_min=rubric.scale_min,
            scale_max=rubric.scale_max,
            instruction=delimited(elide(instruction, max_chars // 5), nonce),
            samples=samples,
            answer_format=fmt,
        )

    room = max(200 * len(positions), max_chars - len(render("")))
    each = room // max(1, len(positions))
    blocks = []
    for i, sid in zip(positions, ids, strict=True):
        v = view(trajectories[i])
        body = (
            f"final answer:\n{elide(v.final_answer, each // 2)}\n\n"
            f"conversation:\n{elide(v.messages, each // 2)}"
        )
        blocks.append(f"Attempt {sid}:\n{delimited(body, nonce)}")
    return ids, render("\n\n".join(blocks))


def anchors_of(reference: dict[int, float], count: int) -> list[int]:
    """The positions of the reference chunk shown again as anchors: its highest-rewarded,
    then its lowest (the first position of each on ties), ``count`` at most, never twice."""
    order = sorted(reference, key=lambda i: (-reference[i], i))
    picked = [order[0], order[-1]][:count] if order else []
    return list(dict.fromkeys(picked))


@dataclasses.dataclass(frozen=True)
class Link:
    """The linear map of a chunk's rewards onto the reference chunk's scale:
    ``slope * reward + shift``, clamped to ``[0, 1]``."""

    slope: float = 1.0
    shift: float = 0.0

    def __call__(self, reward: float) -> float:
        return min(1.0, max(0.0, self.slope * reward + self.shift))

    def text(self) -> str:
        return f"x{self.slope:.3f} {self.shift:+.3f}"


def link(reference: list[float], again: list[float]) -> Link:
    """The map putting a chunk on the reference chunk's scale, from its anchors: their
    rewards in the reference chunk (``reference``) and in this one (``again``), by the
    mean-sigma method of common-item linear linking (Kolen & Brennan, *Test Equating,
    Scaling, and Linking*, 3rd ed., 2014, section 6.4: slope ``sd(reference) / sd(again)``,
    shift ``mean(reference) - slope * mean(again)``). With one anchor, or anchors the judge
    did not tell apart in either chunk, the slope is 1 and only the mean is matched.

    Raises:
        ValueError: no anchors, or the two lists differ in length.
    """
    if not reference or len(reference) != len(again):
        raise ValueError("link needs the same anchors' rewards in both chunks")
    n = len(reference)
    mean_ref, mean_again = sum(reference) / n, sum(again) / n
    sd_ref = (sum((r - mean_ref) ** 2 for r in reference) / n) ** 0.5
    sd_again = (sum((r - mean_again) ** 2 for r in again) / n) ** 0.5
    slope = sd_ref / sd_again if sd_ref > 1e-9 and sd_again > 1e-9 else 1.0
    return Link(slope=slope, shift=mean_ref - slope * mean_again)


@dataclasses.dataclass
class Turn:
    """One assistant turn of a session: where it is (trace, completion), and its text with
    the tool results that answered it."""

    trace_index: int
    completion_index: int
    text: str


def turns(trajectory: Trajectory) -> list[Turn]:
    """The session's assistant turns, in trace then completion order: a trace's assistant
    messages in ``response_messages`` are its completions' answers, in
    ``completion_indices`` order (the builders append one per completion), each followed by
    the tool and user messages the next call added."""
    out: list[Turn] = []
    for trace in trajectory.traces:
        answers = [k for k, m in enumerate(trace.response_messages) if m.get("role") == "assistant"]
        for n, (k, index) in enumerate(zip(answers, trace.completion_indices, strict=False)):
            end = answers[n + 1] if n + 1 < len(answers) else len(trace.response_messages)
            text = "\n".join(message_text(m) for m in trace.response_messages[k:end])
            out.append(Turn(trace.trace_index, index, text))
    return out


def turn_prompts(
    rubric: Rubric,
    trajectory: Trajectory,
    nonce: str,
    max_chars: int,
    chunk_size: int,
) -> list[tuple[list[Turn], str]]:
    """The prompts scoring each assistant turn: chunks of at most ``chunk_size`` turns, cut
    earlier where the next turn would pass ``max_chars`` (a single turn longer than that loses
    its middle), so every turn is scored however long the session.

    Returns:
        ``(turns, prompt)`` per chunk, in order; every turn in exactly one.
    """
    instruction = elide(view(trajectory).instruction, max_chars // 5)
    all_turns = turns(trajectory)

    def render(chunk: list[Turn], first: int) -> str:
        keys = [str(first + k + 1) for k in range(len(chunk))]
        body = "\n\n".join(
            f"Turn {key}:\n{delimited(t.text, nonce)}" for key, t in zip(keys, chunk, strict=True)
        )
        return rubric.turn_template.format(
            criteria=criteria_text(rubric),
            scale_min=rubric.scale_min,
            scale_max=rubric.scale_max,
            instruction=delimited(instruction, nonce),
            turns=body,
            answer_format=answer_format(rubric, keys, key_name="turn"),
        )

    out: list[tuple[list[Turn], str]] = []
    chunk: list[Turn] = []
    first = 0
    for turn in all_turns:
        room = max_chars - len(render([], first)) - 400
        turn = dataclasses.replace(turn, text=elide(turn.text, max(200, room // 2)))
        if chunk and (len(chunk) >= chunk_size or len(render([*chunk, turn], first)) > max_chars):
            out.append((chunk, render(chunk, first)))
            first += len(chunk)
            chunk = []
        chunk.append(turn)
    if chunk:
        out.append((chunk, render(chunk, first)))
    return out


# --------------------------------------------------------------------------- answers

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_TAG = re.compile(
    r"<score((?:\s+[a-z]+=\"[^\"]*\")*)\s*>\s*(-?\d+(?:\.\d+)?)\s*</score>", re.IGNORECASE
)
_ATTR = re.compile(r"([a-z]+)=\"([^\"]*)\"", re.IGNORECASE)


def _first_json_object(text: str) -> Any:
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    raise JudgeParseError("no JSON object in the answer")


def _criteria_scores(rubric: Rubric, raw: Any, where: str) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise JudgeParseError(f"{where}: expected an object of criterion scores, got {raw!r}"[:300])
    scores: dict[str, float] = {}
    for c in rubric.criteria:
        value = raw.get(c.name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise JudgeParseError(f"{where}: no numeric score for {c.name!r}")
        if not rubric.scale_min <= value <= rubric.scale_max:
            raise JudgeParseError(
                f"{where}: {c.name}={value} is outside [{rubric.scale_min}, {rubric.scale_max}]"
            )
        scores[c.name] = float(value)
    return scores


def parse_scores(
    rubric: Rubric, answer: str, keys: list[str] | None = None, key_name: str = "id"
) -> dict[str, dict[str, float]]:
    """The criterion scores in a judge's answer, by the rubric's output schema.

    Args:
        rubric: the rubric (``output``: ``json`` or ``tag``; criteria; scale).
        answer: the judge's text (a ``<think>`` block and code fences are ignored).
        keys: the ids scored under (a group's samples, a chunk's turns); None for one score
            set, returned under the key ``""``.
        key_name: the tag attribute naming a key (``id`` or ``turn``).

    Returns:
        key -> criterion -> score, every key and every criterion present.

    Raises:
        JudgeParseError: the answer does not follow the schema (a key or criterion missing, a
            score not a number or outside the scale).
    """
    text = _THINK.sub("", answer)
    if rubric.output == "json":
        obj = _first_json_object(text)
        if keys is None:
            return {"": _criteria_scores(rubric, obj, "answer")}
        missing = [k for k in keys if k not in obj]
        if missing:
            raise JudgeParseError(f"no scores for {', '.join(missing)}")
        return {k: _criteria_scores(rubric, obj[k], k) for k in keys}
    found: dict[str, dict[str, float]] = {}
    for attrs, number in _TAG.findall(text):
        named = dict(_ATTR.findall(attrs))
        found.setdefault(named.get(key_name, ""), {})[named.get("name", "")] = float(number)
    wanted = keys if keys is not None else [""]
    return {k: _criteria_scores(rubric, found.get(k), k or "answer") for k in wanted}


def rewards(rubric: Rubric, scores: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each key's reward from its criterion scores (:meth:`Rubric.reward`)."""
    return {k: rubric.reward(v) for k, v in scores.items()}
