"""A generation's journal (one blob per row done), its filters, its summary and its outputs.

The journal is ``generations/{name}/rows/{safe_key}.json`` in the blob store, one
:class:`~rolloutd.workflows.generation.models.JournalEntry` per row, written create-exclusive:
a row is journaled once, whoever writes it first. Outputs are rebuilt from the whole journal
on every run, so they always cover every row done, whichever run did it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from rolloutd.errors import NotFoundError
from rolloutd.generation.sources import safe_key
from rolloutd.scoring import pass_rates, scored_rewards
from rolloutd.store import BlobExistsError, BlobStore, whole_group
from rolloutd.trainer_client.training.exports import to_openai_messages_jsonl, to_parquet
from rolloutd.types import Trajectory
from rolloutd.workflows.generation.models import (
    GenerationFilters,
    GenerationSpec,
    GenerationSummary,
    JournalEntry,
)

SFT_FILE = "sft.jsonl"
PARQUET_FILE = "traces.parquet"
DATASET_DIR = "dataset"


def journal_prefix(name: str) -> str:
    """Blob-store folder of a generation's journal."""
    return f"generations/{name}/rows"


def journal_key(name: str, key: str) -> str:
    """Blob-store key of one row's journal entry."""
    return f"{journal_prefix(name)}/{safe_key(key)}.json"


def journal_row(store: BlobStore, name: str, entry: JournalEntry) -> bool:
    """Journal a row once.

    Returns:
        True when written now; False when the row was journaled before (nothing changed).
    """
    try:
        store.put_json(journal_key(name, entry.key), entry, exclusive=True)
    except BlobExistsError:
        return False
    return True


def journal_index(store: BlobStore, name: str) -> set[str]:
    """The safe keys (:func:`rolloutd.generation.sources.safe_key`) of a generation's
    journaled rows, from the names of its entries (one listing; no entry is read)."""
    return {
        k.rsplit("/", 1)[-1].removesuffix(".json")
        for k in store.list(journal_prefix(name))
        if k.endswith(".json")
    }


def read_journal(store: BlobStore, name: str) -> list[JournalEntry]:
    """Every journaled row of a generation, by key order, each with its whole group (a row's
    task returns a group over its ``inline_result_bytes`` by reference, and the row is
    journaled so: :func:`rolloutd.store.whole_group` reads it back)."""
    entries = [
        store.get_model(k, JournalEntry)
        for k in store.list(journal_prefix(name))
        if k.endswith(".json")
    ]
    for entry in entries:
        entry.result = whole_group(store, entry.result)
    return entries


def final_answer(trajectory: Trajectory) -> str:
    """The last assistant message's text of a trajectory, whitespace-normalised."""
    for trace in reversed(trajectory.traces):
        for message in reversed(trace.response_messages):
            if message.get("role") == "assistant" and isinstance(message.get("content"), str):
                return re.sub(r"\s+", " ", message["content"]).strip()
    return ""


def select(
    entries: list[JournalEntry], filters: GenerationFilters, load: Callable[[str], Trajectory]
) -> list[Trajectory]:
    """The trajectories the filters keep, by row then sample index.

    A row passes when its pass rate is within ``[min_pass_rate, max_pass_rate]``; of its
    scored samples those with ``reward >= min_reward`` are kept, then one per distinct final
    answer when ``distinct_answers``.

    Args:
        entries: journaled rows.
        filters: the generation's filters.
        load: trajectory_ref -> Trajectory (the blob store's).
    """
    kept: list[Trajectory] = []
    for entry in entries:
        scored = [s for s in entry.result.sessions if s.reward is not None]
        if not scored:
            continue
        rate = sum(s.reward >= filters.pass_reward for s in scored) / len(scored)
        if not filters.min_pass_rate <= rate <= filters.max_pass_rate:
            continue
        answers: set[str] = set()
        for s in sorted(scored, key=lambda s: s.sample_index):
            if filters.min_reward is not None and s.reward < filters.min_reward:
                continue
            if not s.trajectory_ref:
                continue
            trajectory = load(s.trajectory_ref)
            if filters.distinct_answers:
                answer = final_answer(trajectory)
                if answer in answers:
                    continue
                answers.add(answer)
            kept.append(trajectory)
    return kept


def summarize(spec: GenerationSpec, entries: list[JournalEntry]) -> GenerationSummary:
    """pass@1, pass@k (:func:`rolloutd.scoring.pass_rates`), rows, samples and tokens over
    every journaled row."""
    k = spec.template.num_samples
    summary = GenerationSummary(name=spec.name, num_rows=len(entries), k=k)
    for entry in entries:
        sessions = entry.result.sessions
        summary.num_samples += len(sessions)
        summary.num_scored += len(scored_rewards(sessions))
        summary.num_tokens += sum(s.num_trainable_tokens for s in sessions)
    rates = pass_rates((e.result.sessions for e in entries), k, spec.filters.pass_reward)
    summary.num_passing = rates.num_passing
    summary.num_rows_failed = rates.num_rows_failed
    summary.pass_at_1 = rates.pass_at_1
    summary.pass_at_k = rates.pass_at_k
    return summary


def write_outputs(
    spec: GenerationSpec, store: BlobStore, entries: list[JournalEntry]
) -> GenerationSummary:
    """Filter the journaled rows' samples and write the outputs ``spec.outputs`` asks for.

    Files are written under a temporary name and renamed, so a reader never sees half a file.

    Returns:
        The summary with ``num_kept``, the counts written and the paths.

    Raises:
        ImportError: Parquet without pyarrow, or ``datasets`` without the datasets package.
    """
    summary = summarize(spec, entries)

    def load(ref: str) -> Trajectory:
        try:
            return store.get_model(ref, Trajectory)
        except NotFoundError:
            return Trajectory(session_id=ref, task_id="")

    kept = [t for t in select(entries, spec.filters, load) if t.task_id]
    summary.num_kept = len(kept)
    out = Path(spec.outputs.dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    if spec.outputs.sft_jsonl:
        tmp = out / f".{SFT_FILE}.tmp"
        summary.num_sft_lines = to_openai_messages_jsonl(kept, tmp)
        tmp.replace(out / SFT_FILE)
        summary.outputs["sft_jsonl"] = str(out / SFT_FILE)
    if spec.outputs.parquet or spec.outputs.datasets:
        tmp = out / f".{PARQUET_FILE}.tmp"
        summary.num_parquet_rows = to_parquet(kept, tmp)
        tmp.replace(out / PARQUET_FILE)
        summary.outputs["parquet"] = str(out / PARQUET_FILE)
    if spec.outputs.datasets:
        import datasets  # optional extra: rolloutd[data]
        import pyarrow.parquet as pq

        dataset = datasets.Dataset(pq.read_table(out / PARQUET_FILE))
        dataset.save_to_disk(str(out / DATASET_DIR))
        summary.outputs["datasets"] = str(out / DATASET_DIR)
    return summary
