"""Chaining for ``prefix_merging``: which completions of a log continue which chain.

A completion *continues* a chain when its prompt extends the chain's tail: the last
completion's ``prompt_ids + response_ids`` (+ the end-of-turn token when that turn ended by
length and did not sample it), which is how the gateway builds prompts in tokens mode
(docs/architecture.md, "One model call, step by step", step 4). Everything else starts a chain
of its own; nothing is dropped (every completion lands in exactly one trace: POLAR's
prefix_merging lost every completion after a chain broke).

Cost: one pass over the log. A link is first checked on a bounded sample (the end-of-turn
boundary, the tail of the previous prompt, a strided sample of the rest), then verified in full
with one C-level list comparison; a tokens-mode completion whose ``extends`` hint names the
chain's tail is trusted on the sample unless ``verify="full"`` (the gateway built that prefix
itself). 500 completions of 32K tokens cost milliseconds, not the 16M Python comparisons of a
naive prefix search.
"""

from __future__ import annotations

import bisect
import difflib
from dataclasses import dataclass, field
from typing import Literal

import structlog

from rolloutd.errors import BuilderError
from rolloutd.types import CaptureMode, Completion

log = structlog.get_logger(__name__)

#: tokens compared at each end of a prefix before a full comparison.
_EDGE = 32
#: tokens of a strided sample over the rest of a prefix.
_STRIDE_SAMPLES = 64

ChainStart = Literal["first", "fresh", "fork", "drift", "no_tokens"]


@dataclass
class Link:
    """How one completion joined its chain.

    Attributes:
        index: the completion's ``index``.
        delta_start: position in this completion's ``prompt_ids`` where the tokens that are
            new to the chain begin (tool results, user turns); 0 for a chain's head.
        eot_inserted: the previous turn ended by length; the end-of-turn token goes after it.
        drift: differences between the previous turn as sampled (its response, plus the
            inserted end-of-turn token) and as re-rendered in this prompt: ``(i1, i2, j1, j2)``
            with ``sampled[i1:i2]`` replaced by ``rendered[j1:j2]`` (difflib opcodes).
    """

    index: int
    delta_start: int = 0
    eot_inserted: bool = False
    drift: list[tuple[int, int, int, int]] = field(default_factory=list)


@dataclass
class Chain:
    """One future trace: its links in order, why it started, the retries collapsed into it."""

    links: list[Link]
    start: ChainStart
    retry_indices: list[int] = field(default_factory=list)


@dataclass
class ChainPlan:
    """Result of :func:`plan_chains`; counts feed :class:`rolloutd.types.BuilderStats`."""

    chains: list[Chain]
    num_retries_collapsed: int = 0
    num_drift_tokens: int = 0
    num_drift_turns: int = 0


def drift_count(ops: list[tuple[int, int, int, int]]) -> int:
    """Differing tokens of a merge: per difference, the larger of its two sides."""
    return sum(max(i2 - i1, j2 - j1) for i1, i2, j1, j2 in ops)


def _has_tokens(c: Completion) -> bool:
    return bool(c.prompt_ids)


def _prefix_probe(seq: list[int], prefix: list[int]) -> bool:
    """Cheap necessary condition for ``seq[:len(prefix)] == prefix``: edges and a sample."""
    n = len(prefix)
    if len(seq) < n or (n and (seq[n - 1] != prefix[-1] or seq[0] != prefix[0])):
        return False
    edge = min(n, _EDGE)
    if seq[n - edge : n] != prefix[n - edge :] or seq[:edge] != prefix[:edge]:
        return False
    step = max(1, n // _STRIDE_SAMPLES)
    return seq[0:n:step] == prefix[0:n:step]


def _prefix_equal(seq: list[int], prefix: list[int]) -> bool:
    return len(seq) >= len(prefix) and seq[: len(prefix)] == prefix


class _Planner:
    """Single pass over a completion log; see :func:`plan_chains`."""

    def __init__(
        self,
        completions: list[Completion],
        end_of_turn_id: int,
        on_drift: Literal["keep", "split"],
        verify: Literal["sampled", "full"],
    ) -> None:
        self.by_index = {c.index: c for c in completions}
        self.eot = end_of_turn_id
        self.on_drift = on_drift
        self.verify = verify
        self.plan = ChainPlan(chains=[])
        self.chain_of: dict[int, int] = {}  # completion index -> chain id
        self.canonical: dict[int, int] = {}  # retry index -> the completion it repeats
        self.retry_keys: dict[tuple, list[int]] = {}
        self.nodes: list[int] = []  # completions with token ids that are not retries
        #: ``nodes`` as (prompt length, index), ascending: kept sorted as nodes are added
        #: (bisect), so finding a parent turn never sorts every node again
        self.nodes_by_length: list[tuple[int, int]] = []
        #: chain ids, the one whose tail was set last at the end: a tail only ever moves to
        #: the completion being placed, so this is the order of the tails' indices
        self.tail_order: dict[int, None] = {}
        self.seen: list[int] = []  # completions placed so far, retries excluded

    # ------------------------------------------------------------------ helpers
    def turn_as_sampled(self, c: Completion) -> list[int]:
        """``response_ids`` (+ end-of-turn token when the turn ended without sampling it)."""
        return c.response_ids + [self.eot] if not c.end_of_turn_sampled else c.response_ids

    def tail(self, chain_id: int) -> Completion:
        return self.by_index[self.plan.chains[chain_id].links[-1].index]

    def extends_exactly(self, c: Completion, prev: Completion, *, trusted: bool) -> bool:
        """Whether ``c.prompt_ids`` starts with ``prev``'s prompt and turn as sampled."""
        turn = self.turn_as_sampled(prev)
        n = len(prev.prompt_ids)
        end = n + len(turn)
        if len(c.prompt_ids) < end or (turn and c.prompt_ids[end - 1] != turn[-1]):
            return False
        if c.prompt_ids[n:end] != turn:
            return False
        if not _prefix_probe(c.prompt_ids, prev.prompt_ids):
            return False
        return trusted or _prefix_equal(c.prompt_ids, prev.prompt_ids)

    def drifted_turn(self, c: Completion, prev: Completion) -> tuple[int, list] | None:
        """Locate ``prev``'s turn as re-rendered in ``c.prompt_ids``, when ``c`` continues it.

        ``c`` continues ``prev`` with drift when its prompt starts with ``prev.prompt_ids``
        exactly and an end-of-turn token follows (the re-rendered assistant turn ends there).

        Returns:
            ``(end, opcodes)``: the position after the re-rendered turn in ``c.prompt_ids`` and
            the differences sampled -> rendered; None when ``c`` does not continue ``prev``.
        """
        n = len(prev.prompt_ids)
        if not (
            _prefix_probe(c.prompt_ids, prev.prompt_ids)
            and _prefix_equal(c.prompt_ids, prev.prompt_ids)
        ):
            return None
        try:
            end = c.prompt_ids.index(self.eot, n) + 1
        except ValueError:
            return None
        sampled, rendered = self.turn_as_sampled(prev), c.prompt_ids[n:end]
        matcher = difflib.SequenceMatcher(None, sampled, rendered, autojunk=False)
        ops = [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
        return end, ops

    def retry_of(self, c: Completion) -> int | None:
        """The earlier completion with the same prompt and the same answer, if any."""
        if not _has_tokens(c):
            return None
        key = (
            len(c.prompt_ids),
            tuple(c.prompt_ids[-_EDGE:]),
            tuple(c.response_ids),
            c.end_of_turn_sampled,
        )
        for j in self.retry_keys.get(key, []):
            if self.by_index[j].prompt_ids == c.prompt_ids:
                return j
        self.retry_keys.setdefault(key, []).append(c.index)
        return None

    def shares_a_head(self, c: Completion) -> bool:
        """Whether ``c``'s prompt starts with the first prompt of an existing chain (a fork)."""
        for chain in self.plan.chains:
            head = self.by_index[chain.links[0].index]
            if (
                _has_tokens(head)
                and _prefix_probe(c.prompt_ids, head.prompt_ids)
                and _prefix_equal(c.prompt_ids, head.prompt_ids)
            ):
                return True
        return False

    def history_continues(self, c: Completion, prev: Completion) -> bool:
        """Message history: ``c``'s messages are ``prev``'s, then ``prev``'s answer."""
        n = len(prev.messages)
        if not n or len(c.messages) <= n or c.messages[:n] != prev.messages:
            return False
        return c.messages[n].get("content") == prev.response_message.get("content")

    # ------------------------------------------------------------------ decisions
    def new_chain(self, c: Completion, start: ChainStart) -> None:
        self.chain_of[c.index] = len(self.plan.chains)
        self.tail_order[len(self.plan.chains)] = None
        self.plan.chains.append(Chain(links=[Link(index=c.index)], start=start))
        if start in ("fork", "drift"):
            log.debug("chain_break", completion_index=c.index, reason=start)

    def join(self, chain_id: int, c: Completion, link: Link) -> None:
        self.chain_of[c.index] = chain_id
        self.plan.chains[chain_id].links.append(link)
        self.tail_order.pop(chain_id, None)
        self.tail_order[chain_id] = None

    def exact_link(self, c: Completion, prev: Completion) -> Link:
        delta = len(prev.prompt_ids) + len(self.turn_as_sampled(prev))
        return Link(index=c.index, delta_start=delta, eot_inserted=not prev.end_of_turn_sampled)

    def fresh_or_fork(self, c: Completion) -> None:
        if not self.plan.chains:
            self.new_chain(c, "first")
        else:
            self.new_chain(c, "fork" if self.shares_a_head(c) else "fresh")

    def place_hinted(self, c: Completion) -> bool:
        """Follow ``c.extends``; returns False when the general search must decide."""
        assert c.extends is not None
        j = self.canonical.get(c.extends, c.extends)
        if c.extends >= c.index or j not in self.chain_of:
            raise BuilderError(
                f"completion {c.index} extends completion {c.extends}, "
                "which is not an earlier completion of this log"
            )
        prev = self.by_index[j]
        if not _has_tokens(prev):
            return False  # nothing to extend; the search decides (usually a fresh chain)
        tokens_mode = c.capture_mode == CaptureMode.TOKENS
        trusted = tokens_mode and self.verify == "sampled"
        if not self.extends_exactly(c, prev, trusted=trusted):
            if tokens_mode:
                raise BuilderError(
                    f"completion {c.index} (tokens mode) extends completion {c.extends}, but its "
                    f"prompt does not start with that completion's prompt and sampled tokens: "
                    "drift must be zero in tokens mode"
                )
            return False
        chain_id = self.chain_of[j]
        if self.plan.chains[chain_id].links[-1].index == j:
            self.join(chain_id, c, self.exact_link(c, prev))
        else:
            self.new_chain(c, "fork")  # the chain moved on past j: a branch from j
        return True

    def place_searched(self, c: Completion) -> None:
        """No usable hint: the chain tail ``c`` extends exactly, else ``c``'s parent turn.

        The parent turn is the earlier turn with the longest prompt that ``c``'s prompt strictly
        extends (see :meth:`parent_turn`). ``c`` continues its chain only when it is the tail:
        with drift in passthrough mode; otherwise ``c`` is a branch and starts a chain.
        """
        best: tuple | None = None
        for chain_id in reversed(self.tail_order):  # the most recent tail first
            prev = self.tail(chain_id)
            if _has_tokens(prev) and self.extends_exactly(c, prev, trusted=False):
                # longest tail first, then message history, then the most recent tail
                rank = (
                    len(prev.prompt_ids) + len(self.turn_as_sampled(prev)),
                    self.history_continues(c, prev),
                )
                if best is None or rank > best[0]:
                    best = (rank, chain_id, prev)
        if best is not None:
            self.join(best[1], c, self.exact_link(c, best[2]))
            return
        parent = self.parent_turn(c)
        if parent is None:
            self.fresh_or_fork(c)
            return
        prev, found = parent
        chain_id = self.chain_of[prev.index]
        is_tail = self.plan.chains[chain_id].links[-1].index == prev.index
        if not is_tail or found is None or c.capture_mode == CaptureMode.TOKENS:
            self.new_chain(c, "fork")  # a branch from an earlier turn, or a fresh render
        elif self.answered_elsewhere(c, prev):
            self.fresh_or_fork(c)
        else:
            self.place_drifting(c, chain_id, prev, found)

    def answered_elsewhere(self, c: Completion, prev: Completion) -> bool:
        """Message history vetoes a drifting merge: ``c`` continues another call's answer.

        The earlier completion with the longest messages that ``c``'s messages continue (with
        its answer) is ``c``'s parent by history; when it is neither ``prev`` nor a call made
        after ``prev`` in ``prev``'s conversation (a sibling, e.g. a call without token ids),
        the turn that differs from ``prev``'s is that other answer, not drift.
        """
        parents = [
            self.by_index[i] for i in self.seen if self.history_continues(c, self.by_index[i])
        ]
        if not parents:
            return False
        other = max(parents, key=lambda o: (len(o.messages), o.index))
        return other.index != prev.index and not self.history_continues(other, prev)

    def parent_turn(self, c: Completion) -> tuple[Completion, tuple[int, list] | None] | None:
        """The turn ``c`` follows: the deepest earlier prompt that ``c``'s prompt extends.

        Among turns with that same prompt (retries with another answer, sub-agents with equal
        first prompts), the one whose answer ``c``'s prompt repeats exactly wins, then the one
        whose answer ``c``'s message history continues, then the least drift, then the latest.

        Returns:
            ``(turn, drift)`` where drift is None when ``c`` repeats the turn exactly, or
            ``(end, opcodes)`` as in :meth:`drifted_turn`; None when no turn qualifies.
        """
        # the nodes with prompts shorter than c's, longest first (ties: any order, the rank
        # ends with the index)
        shorter = bisect.bisect_left(self.nodes_by_length, (len(c.prompt_ids), -1))
        best_rank: tuple | None = None
        best: tuple[Completion, tuple[int, list] | None] | None = None
        for at in range(shorter - 1, -1, -1):
            n, index = self.nodes_by_length[at]
            prev = self.by_index[index]
            if best_rank is not None and n < best_rank[0]:
                break
            found: tuple[int, list] | None = None
            if self.extends_exactly(c, prev, trusted=False):
                rank = (n, 1, 1, 0, index)
            else:
                found = self.drifted_turn(c, prev)
                if found is None:
                    continue
                rank = (n, 0, int(self.history_continues(c, prev)), -drift_count(found[1]), index)
            if best_rank is None or rank > best_rank:
                best_rank, best = rank, (prev, found)
        return best

    def place_drifting(
        self, c: Completion, chain_id: int, prev: Completion, found: tuple[int, list]
    ) -> None:
        end, ops = found
        num = drift_count(ops)
        self.plan.num_drift_tokens += num
        self.plan.num_drift_turns += 1
        log.debug(
            "drift_detected",
            completion_index=c.index,
            previous_index=prev.index,
            num_drift_tokens=num,
            on_drift=self.on_drift,
        )
        if self.on_drift == "split":
            self.new_chain(c, "drift")
        else:
            self.join(
                chain_id,
                c,
                Link(
                    index=c.index,
                    delta_start=end,
                    eot_inserted=not prev.end_of_turn_sampled,
                    drift=ops,
                ),
            )

    def place(self, c: Completion) -> None:
        original = self.retry_of(c)
        if original is not None:
            original = self.canonical.get(original, original)
            self.canonical[c.index] = original
            self.chain_of[c.index] = self.chain_of[original]
            self.plan.chains[self.chain_of[original]].retry_indices.append(c.index)
            self.plan.num_retries_collapsed += 1
            return
        if not _has_tokens(c):
            self.new_chain(c, "no_tokens")
        else:
            if c.extends is None or not self.place_hinted(c):
                self.place_searched(c)
            self.nodes.append(c.index)
            bisect.insort(self.nodes_by_length, (len(c.prompt_ids), c.index))
        self.seen.append(c.index)


def plan_chains(
    completions: list[Completion],
    *,
    end_of_turn_id: int,
    on_drift: Literal["keep", "split"] = "split",
    verify: Literal["sampled", "full"] = "sampled",
) -> ChainPlan:
    """Assign every completion of a log to exactly one chain.

    Rules: a completion continues the chain whose tail its prompt extends (ties: the
    longest tail, then the chain whose message history it continues, then the most recent);
    a retry with the same prompt and the same answer is collapsed into the completion it
    repeats; anything else (a retry with another answer, a sub-agent, a parallel branch, a
    compacted context, a completion without tokens) starts a chain. A passthrough completion
    whose prompt starts with a tail's prompt but re-renders the tail's turn differently drifts:
    ``on_drift`` decides whether it continues (``keep``) or starts a chain (``split``).

    Args:
        completions: the completion log, ordered by ``index`` (indices unique).
        end_of_turn_id: the tokenizer's end-of-turn token (see ``end_of_turn_id``).
        on_drift: ``keep`` or ``split`` (``BuilderSpec.on_drift``).
        verify: ``full`` compares every prefix token of every link; ``sampled`` trusts the
            gateway's ``extends`` hint in tokens mode after a bounded sampled comparison.

    Returns:
        The chains in order of their first completion, with retry and drift counts.

    Raises:
        BuilderError: an ``extends`` hint names no earlier completion, or a tokens-mode
            completion does not extend the completion it names (drift in tokens mode).
    """
    planner = _Planner(completions, end_of_turn_id, on_drift, verify)
    for c in completions:
        planner.place(c)
    return planner.plan
