"""A simulated gateway that writes completion logs with known structure, over a real tokenizer.

A *script* (drawn by hypothesis) is a list of events: agent turns, identical retries, retries with
another answer, sub-agents (optionally with the first prompt of an existing agent), parallel
branches, context compaction, calls without token ids. Each sampled answer may carry ``<think>``
reasoning, may end by length, and may sample one word in a non-canonical tokenization
(re-tokenization drift in passthrough). Sessions run in ``tokens`` mode (the gateway's token chain,
docs/architecture.md) or ``passthrough`` mode (the backend renders the template, optionally one that
strips reasoning from previous assistant turns).

Alongside the log the generator records what a correct builder must produce, from the logical
structure alone (which call continues which, which one repeats which): the chains, the retries,
the chain breaks, and where drift was put. It checks its own tokenization assumptions with
assertions, so a failure in one of them is a generator bug, not a builder bug.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from rolloutd.types import CaptureMode, Completion

ANSWER_WORDS = (
    "file",
    "test",
    "run",
    "value",
    "list",
    "code",
    "error",
    "data",
    "line",
    "read",
    "write",
    "check",
    "build",
    "open",
    "close",
    "start",
    "stop",
    "return",
    "print",
    "update",
    "search",
    "result",
    "path",
    "table",
    "query",
)
THINK_WORDS = (
    "maybe",
    "consider",
    "hmm",
    "perhaps",
    "guess",
    "plan",
    "idea",
    "wonder",
    "suppose",
    "likely",
)
SYSTEM = {"role": "system", "content": "You are a careful coding agent."}

#: Qwen2.5's template with previous assistant turns rendered without their reasoning
#: (Qwen3 and DeepSeek-R1 templates do this).
STRIP_FIND = "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
STRIP_REPLACE = (
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content.split('</think>')"
    "[-1].lstrip('\\n') if message.role == 'assistant' else message.content) "
    "+ '<|im_end|>' + '\\n' }}"
)


@dataclass(frozen=True)
class Answer:
    """Draws for one sampled answer."""

    think_words: tuple[int, ...]
    answer_words: tuple[int, ...]
    truncate_at: int | None  # keep this many answer tokens and end by length
    retok_word: int | None  # position in answer_words sampled in pieces
    trainable: bool


@dataclass(frozen=True)
class Event:
    kind: str  # turn | retry_same | retry_diff | subagent | branch | compaction | opaque
    agent: int
    answer: Answer
    same_task: bool = True


answers = st.builds(
    Answer,
    think_words=st.lists(st.integers(0, len(THINK_WORDS) - 1), max_size=4).map(tuple),
    answer_words=st.lists(st.integers(0, len(ANSWER_WORDS) - 1), min_size=1, max_size=5).map(tuple),
    truncate_at=st.none() | st.integers(1, 6),
    retok_word=st.none() | st.integers(0, 4),
    trainable=st.sampled_from([True, True, True, False]),
)
events = st.builds(
    Event,
    kind=st.sampled_from(
        ["turn"] * 6 + ["retry_same", "retry_diff", "subagent", "branch", "compaction", "opaque"]
    ),
    agent=st.integers(0, 7),
    answer=answers,
    same_task=st.booleans(),
)


@st.composite
def scripts(draw: st.DrawFn) -> dict[str, Any]:
    """A session script: mode, template, events."""
    mode = draw(st.sampled_from([CaptureMode.TOKENS, CaptureMode.PASSTHROUGH]))
    strip = mode == CaptureMode.PASSTHROUGH and draw(st.booleans())
    return {"mode": mode, "strip": strip, "events": draw(st.lists(events, min_size=1, max_size=12))}


@dataclass
class Sampled:
    """One answer as the backend sampled it."""

    response_ids: list[int]
    text: str
    num_think: int  # leading reasoning tokens (a template that strips reasoning removes them)
    retok_positions: list[int]  # positions of the pieces of a non-canonically sampled word
    ended_by_length: bool


@dataclass
class Agent:
    messages: list[dict[str, Any]]
    last: int | None = None  # completion the next call extends (tokens mode)
    last_tokens: int | None = None  # last completion with token ids (passthrough parent)


@dataclass
class Expected:
    """What a correct prefix_merging builder produces for the log."""

    chains: list[list[int]] = field(default_factory=list)
    retries: list[list[int]] = field(default_factory=list)
    num_breaks: int = 0
    #: per drifting merge: (previous completion, completion, drift tokens, positions in prev)
    drifts: list[tuple[int, int, int, list[int]]] = field(default_factory=list)
    sampled: dict[int, Sampled] = field(default_factory=dict)


class SessionGenerator:
    """Turns scripts into completion logs with their expected reconstruction."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.strip_template = tokenizer.chat_template.replace(STRIP_FIND, STRIP_REPLACE)
        assert self.strip_template != tokenizer.chat_template
        canonical = {w: self.encode(" " + w) for w in ANSWER_WORDS}
        assert all(len(ids) == 1 for ids in canonical.values())
        self.pieces: dict[str, list[int]] = {}
        vocab = {ids[0] for ids in canonical.values()}
        for w in ANSWER_WORDS:
            pieces = self.encode(" " + w[:2]) + self.encode(w[2:])
            if len(pieces) >= 2 and not set(pieces) & vocab:
                self.pieces[w] = pieces

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def render(self, messages: list[dict[str, Any]], *, strip: bool, generation: bool) -> str:
        return self.tok.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=generation,
            chat_template=self.strip_template if strip else None,
        )

    # ------------------------------------------------------------------ sampling
    def sample(self, answer: Answer, taken: set[tuple[int, ...]]) -> Sampled:
        """Token ids of an answer; unique in the session (only retry_same repeats one)."""
        words = [ANSWER_WORDS[i] for i in answer.answer_words]
        think = (
            (
                "<think>\n"
                + "".join(" " + THINK_WORDS[i] for i in answer.think_words)
                + "\n</think>\n\n"
            )
            if answer.think_words
            else ""
        )
        extra = 0
        while True:
            body = (
                ["OK"]
                + [" " + w for w in words]
                + [" " + ANSWER_WORDS[(len(taken) + k) % len(ANSWER_WORDS)] for k in range(extra)]
            )
            think_ids = self.encode(think) if think else []
            ids = list(think_ids)
            retok: list[int] = []
            for position, piece in enumerate(body):
                word = piece.strip()
                if (
                    answer.retok_word is not None
                    and position == answer.retok_word + 1
                    and (answer.truncate_at is None or extra)
                    and word in self.pieces
                ):
                    retok = list(range(len(ids), len(ids) + len(self.pieces[word])))
                    ids += self.pieces[word]
                else:
                    ids += self.encode(piece)
            assert self.encode(think + "".join(body)) == think_ids + self.encode("".join(body))
            # a collision is made unique by more words, so a truncated answer stops instead
            length = (
                extra == 0 and answer.truncate_at is not None and answer.truncate_at < len(body)
            )
            if length:
                ids = ids[: len(think_ids) + answer.truncate_at]
                retok = []
            else:
                ids.append(self.eot)
            if tuple(ids) not in taken:
                taken.add(tuple(ids))
                text = self.tok.decode([i for i in ids if i != self.eot])
                return Sampled(ids, text, len(think_ids), retok, length)
            extra += 1


def _logprobs(ids: list[int], seed: int) -> list[float]:
    return [-((seed * 7919 + k * 104729) % 1000) / 1000.0 - 0.001 for k in range(len(ids))]


class _Run:
    """One script being played; see :meth:`SessionGenerator.generate`."""

    def __init__(self, gen: SessionGenerator, script: dict[str, Any]) -> None:
        self.gen = gen
        self.mode: CaptureMode = script["mode"]
        self.strip: bool = script["strip"]
        self.log: list[Completion] = []
        self.agents: list[Agent] = []
        self.expected = Expected()
        self.taken: set[tuple[int, ...]] = set()
        self.counter = 0
        # the expected model: chain of each completion, tail of each chain, parents
        self.chain_of: dict[int, int] = {}
        self.canonical: dict[int, int] = {}
        self.tokenful_heads: list[list[dict[str, Any]]] = []
        self.parent_of: dict[int, int | None] = {}

    def fresh_task(self) -> list[dict[str, Any]]:
        self.counter += 1
        return [SYSTEM, {"role": "user", "content": f"task {self.counter}: fix the tests"}]

    def new_message(self) -> dict[str, Any]:
        self.counter += 1
        role = "tool" if self.counter % 3 else "user"
        return {"role": role, "content": f"result {self.counter}: 3 passed"}

    # ------------------------------------------------------------------ expectations
    def expect(
        self, c: Completion, parent: int | None, drift: tuple[int, list[int]] | None, split: bool
    ) -> None:
        """Place ``c`` in the expected chains (the chain rules of
        :func:`rolloutd.trajectory.chains.plan_chains`, from logical structure)."""
        exp = self.expected
        if parent is not None:
            parent = self.canonical.get(parent, parent)
        if not c.prompt_ids:
            self.chain_of[c.index] = len(exp.chains)
            exp.chains.append([c.index])
            exp.retries.append([])
            return
        continues = parent is not None and exp.chains[self.chain_of[parent]][-1] == parent
        if continues and drift is not None and drift[0]:
            exp.drifts.append((parent, c.index, drift[0], drift[1]))
        if continues and not (split and drift is not None and drift[0]):
            self.chain_of[c.index] = self.chain_of[parent]
            exp.chains[self.chain_of[parent]].append(c.index)
            return
        drift_split = continues
        fork = any(c.messages[: len(h)] == h for h in self.tokenful_heads)
        if exp.chains and (drift_split or fork):
            exp.num_breaks += 1
        self.chain_of[c.index] = len(exp.chains)
        exp.chains.append([c.index])
        exp.retries.append([])
        self.tokenful_heads.append(list(c.messages))

    def drift_of(self, prev: Completion, c: Completion) -> tuple[int, list[int]]:
        """Drift the generator put between ``prev``'s turn and its re-render in ``c``."""
        if self.mode == CaptureMode.TOKENS:
            return 0, []
        sampled = self.expected.sampled[prev.index]
        positions = list(range(sampled.num_think)) if self.strip else []
        positions += sampled.retok_positions
        # self-check: the re-rendered turn is what the generator believes it is
        body = prev.response_ids[sampled.num_think if self.strip else 0 :]
        rendered = [t for t in body if t != self.gen.eot]
        n = len(prev.prompt_ids)
        assert c.prompt_ids[:n] == prev.prompt_ids, "generator: prompt prefix not stable"
        end = c.prompt_ids.index(self.gen.eot, n)
        canonical = self.gen.encode(self.gen.tok.decode(rendered))
        assert c.prompt_ids[n:end] == canonical, "generator: re-rendered turn not canonical"
        return len(positions), sorted(positions)

    def place(self, c: Completion, parent: int | None, split: bool) -> None:
        self.parent_of[c.index] = parent
        drift = None
        if parent is not None and c.prompt_ids:
            drift = self.drift_of(self.log[self.canonical.get(parent, parent)], c)
        self.expect(c, parent, drift, split)

    # ------------------------------------------------------------------ events
    def call(
        self,
        agent: Agent,
        answer: Answer,
        *,
        prompt_ids: list[int] | None = None,
        extends: int | None = None,
        opaque: bool = False,
    ) -> Completion:
        sampled = self.gen.sample(answer, self.taken)
        index = len(self.log)
        trainable = answer.trainable and not opaque
        if prompt_ids is None:
            prompt_ids = self.gen.encode(
                self.gen.render(agent.messages, strip=self.strip, generation=True)
            )
        c = Completion(
            session_id="gen",
            index=index,
            capture_mode=self.mode,
            messages=[dict(m) for m in agent.messages],
            prompt_ids=[] if opaque else prompt_ids,
            response_ids=[] if opaque else sampled.response_ids,
            response_logprobs=[]
            if opaque
            else (
                _logprobs(sampled.response_ids, index)
                if trainable
                else [0.0] * len(sampled.response_ids)
            ),
            response_text=sampled.text,
            response_message={"role": "assistant", "content": sampled.text},
            finish_reason="length" if sampled.ended_by_length else "stop",
            end_of_turn_sampled=not sampled.ended_by_length,
            extends=extends if self.mode == CaptureMode.TOKENS else None,
            trainable=trainable,
        )
        self.log.append(c)
        self.expected.sampled[index] = sampled
        return c

    def tokens_prompt(self, agent: Agent) -> tuple[list[int], int | None]:
        """The gateway's token chain: previous prompt + sampled (+ eot) + new messages."""
        if agent.last is None:
            return self.gen.encode(
                self.gen.render(agent.messages, strip=False, generation=True)
            ), None
        prev = self.log[agent.last]
        upto = self.gen.render(agent.messages[:-1], strip=False, generation=False)
        full = self.gen.render(agent.messages, strip=False, generation=True)
        assert full.startswith(upto) and upto.endswith("<|im_end|>\n")
        tail = [self.gen.eot] if not prev.end_of_turn_sampled else []
        new_ids = self.gen.encode("\n" + full[len(upto) :])
        prompt = prev.prompt_ids + prev.response_ids + tail + new_ids
        return prompt, agent.last

    def exact_sibling(self, c: Completion, parent: int | None) -> int | None:
        """The turn a passthrough prompt follows: ``parent``, unless another turn with the
        same prompt (a retry with another answer) is repeated token for token by ``c``'s
        prompt while ``parent``'s re-render drifts (a template that strips reasoning makes a
        retry that differs only in its reasoning render as the original did). The builder's
        rule (:meth:`rolloutd.trajectory.chains._Planner.parent_turn`): an exact repeat wins.
        """
        if parent is None or not c.prompt_ids:
            return parent
        head = self.log[self.canonical.get(parent, parent)]
        exact = [
            s.index
            for s in self.log[: c.index]
            if s.index != head.index
            and s.index not in self.canonical
            and s.prompt_ids
            and s.prompt_ids == head.prompt_ids
            and s.end_of_turn_sampled
            and c.prompt_ids[: len(s.prompt_ids) + len(s.response_ids)]
            == s.prompt_ids + s.response_ids
        ]
        return max(exact) if exact else parent

    def turn(self, agent: Agent, answer: Answer, split: bool, opaque: bool = False) -> None:
        if agent.last is not None:
            agent.messages.append(self.new_message())
        if self.mode == CaptureMode.TOKENS:
            opaque = False
            prompt, extends = self.tokens_prompt(agent)
            c = self.call(agent, answer, prompt_ids=prompt, extends=extends)
            parent = agent.last
        else:
            c = self.call(agent, answer, opaque=opaque)
            parent = self.exact_sibling(c, agent.last_tokens)
        self.place(c, parent, split)
        agent.messages.append(dict(c.response_message))
        agent.last = c.index
        if c.prompt_ids:
            agent.last_tokens = c.index

    def retry_same(self, agent: Agent) -> None:
        if agent.last is None or not self.log[agent.last].prompt_ids:
            return
        original = self.canonical.get(agent.last, agent.last)
        c = self.log[original].model_copy(update={"index": len(self.log)}, deep=True)
        self.log.append(c)
        self.canonical[c.index] = original
        self.parent_of[c.index] = self.parent_of[original]
        self.chain_of[c.index] = self.chain_of[original]
        self.expected.retries[self.chain_of[original]].append(c.index)
        self.expected.sampled[c.index] = self.expected.sampled[original]
        agent.last = agent.last_tokens = c.index

    def retry_diff(self, agent: Agent, answer: Answer, split: bool) -> None:
        if agent.last is None or not self.log[agent.last].prompt_ids:
            return
        before = self.log[self.canonical.get(agent.last, agent.last)]
        agent.messages.pop()  # the answer being retried
        c = self.call(agent, answer, prompt_ids=list(before.prompt_ids), extends=before.extends)
        self.place(c, self.parent_of[before.index], split)
        agent.messages.append(dict(c.response_message))
        agent.last = agent.last_tokens = c.index


def generate(
    gen: SessionGenerator, script: dict[str, Any], *, split: bool
) -> tuple[list[Completion], Expected]:
    """Play a script; returns the completion log and what a correct builder makes of it."""
    run = _Run(gen, script)
    run.agents.append(Agent(messages=run.fresh_task()))
    for event in script["events"]:
        agent = run.agents[event.agent % len(run.agents)]
        if event.kind in ("turn", "opaque"):
            run.turn(agent, event.answer, split, opaque=event.kind == "opaque")
        elif event.kind == "retry_same":
            run.retry_same(agent)
        elif event.kind == "retry_diff":
            run.retry_diff(agent, event.answer, split)
        elif event.kind == "subagent":
            first = run.agents[event.agent % len(run.agents)].messages[:2]
            messages = [dict(m) for m in first] if event.same_task else run.fresh_task()
            run.agents.append(Agent(messages=messages))
            run.turn(run.agents[-1], event.answer, split)
        elif event.kind == "branch":
            if agent.last is None:
                continue
            run.agents.append(
                Agent(
                    messages=[dict(m) for m in agent.messages],
                    last=agent.last,
                    last_tokens=agent.last_tokens,
                )
            )
            run.turn(run.agents[-1], event.answer, split)
        elif event.kind == "compaction":
            agent.messages = [
                SYSTEM,
                {"role": "user", "content": f"summary {len(run.log)}: tests were fixed"},
            ]
            agent.last = agent.last_tokens = None
            run.turn(agent, event.answer, split)
    return run.log, run.expected
