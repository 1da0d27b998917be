"""The eval fleet's generation activities: plan rows, journal a row, await a task found
running, write the outputs. Called by name from
:class:`~rolloutd.workflows.generation.workflow.GenerationWorkflow`.

Datasets and output folders are read and written on the eval host (its file system), the
journal in the blob store. Temporal owns retries: a dataset that cannot be read or a row that
cannot become a task is a non-retryable ``GenerationSourceError``.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from pydantic import ValidationError
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from rolloutd.activities.names import (
    AWAIT_TASK,
    JOURNAL_ROW,
    PLAN_GENERATION,
    WRITE_GENERATION_OUTPUTS,
)
from rolloutd.errors import ConfigError
from rolloutd.generation import outputs
from rolloutd.generation.sources import read_rows, row_to_task, safe_key
from rolloutd.store import BlobStore
from rolloutd.types import TaskResult
from rolloutd.workflows.generation.models import (
    AwaitTaskInput,
    GenerationSummary,
    JournalRowInput,
    JournalRowOutput,
    JournalTotals,
    PlanInput,
    PlannedRow,
    PlanOutput,
    WriteOutputsInput,
)
from rolloutd.workflows.generation.workflow import failed, passing

log = structlog.get_logger(__name__)
#: how often ``await_task`` heartbeats while the task runs
AWAIT_HEARTBEAT_EVERY_S = 10.0


class GenerationActivities:
    """Generation I/O on the eval fleet; owns a Temporal client (to await tasks) and the store.

    Args:
        client: a Temporal client with rolloutd's data converter.
        store: the blob store holding journals and trajectories.
    """

    def __init__(self, client: Client, store: BlobStore) -> None:
        self.client = client
        self.store = store

    @activity.defn(name=PLAN_GENERATION)
    async def plan_generation(self, input: PlanInput) -> PlanOutput:
        """Up to ``limit`` rows from source row ``start`` on that are not journaled, as tasks,
        with the journal's totals.

        The journal is asked by its index (the names of its entries: one listing, no entry
        read) which rows are done; its entries are read only to count the totals when the
        workflow carries none (a chain's first run). A later run reads no entry and plans
        from where the earlier one stopped, so a generation's planning stays linear in its
        rows.

        Raises:
            ApplicationError: non-retryable ``GenerationSourceError`` when the dataset cannot
                be read or a row cannot become a task.
        """
        spec = input.spec
        try:
            rows = await asyncio.to_thread(read_rows, spec.source)
            done = await asyncio.to_thread(outputs.journal_index, self.store, spec.name)
            keys = {safe_key(key) for key, _ in rows}
            planned: list[PlannedRow] = []
            num_pending, next_start = 0, input.start
            for index in range(input.start, len(rows)):
                key, row = rows[index]
                if safe_key(key) in done:
                    continue
                num_pending += 1
                if len(planned) < input.limit:
                    planned.append(PlannedRow(key=key, task=row_to_task(spec, key, row)))
                    next_start = index + 1
            totals = input.totals
            if totals is None:
                entries = await asyncio.to_thread(outputs.read_journal, self.store, spec.name)
                journaled = [e for e in entries if safe_key(e.key) in keys]
                totals = JournalTotals(
                    num_journaled=len(journaled),
                    num_failed=sum(failed(e.result) for e in journaled),
                    num_passing=sum(passing(e.result, spec.filters.pass_reward) for e in journaled),
                )
        except (OSError, ConfigError, ImportError, ValidationError) as e:
            raise ApplicationError(
                f"generation {spec.name}: {type(e).__name__}: {e}",
                type="GenerationSourceError",
                non_retryable=True,
            ) from e
        log.info(
            "generation_planned",
            generation=spec.name,
            num_rows=len(rows),
            num_journaled=totals.num_journaled,
            num_planned=len(planned),
            start=input.start,
            read_entries=input.totals is None,
        )
        return PlanOutput(
            rows=planned,
            num_rows=len(rows),
            num_journaled=totals.num_journaled,
            num_journaled_failed=totals.num_failed,
            num_journaled_passing=totals.num_passing,
            num_pending=num_pending,
            next_start=next_start,
        )

    @activity.defn(name=JOURNAL_ROW)
    async def journal_row(self, input: JournalRowInput) -> JournalRowOutput:
        """Journal one row, once (a retried or repeated call writes nothing)."""
        written = await asyncio.to_thread(outputs.journal_row, self.store, input.name, input.entry)
        log.info(
            "generation_row_journaled", generation=input.name, key=input.entry.key, written=written
        )
        return JournalRowOutput(written=written)

    @activity.defn(name=AWAIT_TASK)
    async def await_task(self, input: AwaitTaskInput) -> TaskResult:
        """The result of a task workflow started earlier, heartbeating while it runs."""
        handle = self.client.get_workflow_handle(input.workflow_id, result_type=TaskResult)
        waiting = asyncio.ensure_future(handle.result())
        try:
            while True:
                done, _ = await asyncio.wait({waiting}, timeout=AWAIT_HEARTBEAT_EVERY_S)
                if done:
                    return waiting.result()
                activity.heartbeat()
        finally:
            if not waiting.done():
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting

    @activity.defn(name=WRITE_GENERATION_OUTPUTS)
    async def write_generation_outputs(self, input: WriteOutputsInput) -> GenerationSummary:
        """Filter every journaled row's samples and write the outputs; the summary."""
        spec = input.spec
        entries = await asyncio.to_thread(outputs.read_journal, self.store, spec.name)
        keys = {key for key, _ in await asyncio.to_thread(read_rows, spec.source)}
        entries = [e for e in entries if e.key in keys]
        activity.heartbeat()
        summary = await asyncio.to_thread(outputs.write_outputs, spec, self.store, entries)
        log.info(
            "generation_outputs_written",
            generation=spec.name,
            num_rows=summary.num_rows,
            num_kept=summary.num_kept,
            num_sft_lines=summary.num_sft_lines,
            num_parquet_rows=summary.num_parquet_rows,
        )
        return summary
