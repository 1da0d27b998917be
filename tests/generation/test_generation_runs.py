"""A generation's runs stay inside Temporal's limits and plan from the journal's index: real
Temporal and the four fleets (the fleets fixture), shell rows in the local runtime (no model
calls), ``rows_per_run`` lowered to 10 so 40 rows take 4 runs.

Each run's history is printed with its events per row, and what 2,000 rows (the bound of
``rows_per_run``) come to; a later run is given the journal's totals and where to start, so
it reads no journal entry (the plan re-read the dataset and the whole journal on every run:
quadratic in rows).
"""

from __future__ import annotations

import uuid

import pytest

from rolloutd.generation.commands import generate
from rolloutd.generation.outputs import journal_index
from rolloutd.store import BlobStore
from rolloutd.workflows.generation.models import MAX_ROWS_PER_RUN, PlanInput
from tests.support.generation_specs import true_rows_spec

pytestmark = [pytest.mark.temporal, pytest.mark.engine]

#: Temporal's event limit of one history
EVENT_LIMIT = 50_000


@pytest.mark.timeout(900)
async def test_forty_rows_in_four_runs_each_planned_from_the_index(fleets, tmp_path) -> None:
    name = f"runs-{uuid.uuid4().hex[:6]}"
    spec = true_rows_spec(name, tmp_path, 40, rows_per_run=10, max_concurrent_rows=10)
    summary = await generate(fleets.client, spec)
    assert summary.num_rows == 40
    assert len(journal_index(BlobStore(fleets.store_url), name)) == 40
    runs = []
    async for execution in fleets.client.list_workflows(f"WorkflowId = 'generation/{name}'"):
        history = await fleets.client.get_workflow_handle(
            execution.id, run_id=execution.run_id
        ).fetch_history()
        plans = [
            e.activity_task_scheduled_event_attributes
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name == "plan_generation"
        ]
        [plan] = plans
        plan_input = PlanInput.model_validate_json(plan.input.payloads[0].data)
        runs.append(
            (
                plan_input.start,
                plan_input.totals is not None,
                len(history.events),
                sum(e.ByteSize() for e in history.events),
            )
        )
    runs.sort()
    print(f"\ngeneration {name}: 40 rows, rows_per_run 10: {len(runs)} runs")
    for start, carried, events, size in runs:
        print(
            f"  from row {start}: {events} events, {size / 1024:.1f} KiB "
            f"({'totals carried' if carried else 'journal counted'})"
        )
    assert [start for start, *_ in runs] == [0, 10, 20, 30]
    # only the first run counts the journal's entries
    assert [carried for _, carried, *_ in runs] == [False, True, True, True]
    per_row = max(events for *_, events, _ in runs) / 10
    projected = per_row * MAX_ROWS_PER_RUN
    print(f"  about {per_row:.1f} events a row: {MAX_ROWS_PER_RUN:,} rows come to {projected:,.0f}")
    assert projected < EVENT_LIMIT * 0.7
