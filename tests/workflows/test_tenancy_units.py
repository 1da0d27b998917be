"""Tenancy without a server: the task's fields and their Temporal priority, POLAR's
``dispatch_priority``, and the sandbox host's slot supplier (``RuntimeSlots``) bounding live
runtimes."""

from __future__ import annotations

import asyncio

import pydantic
import pytest
from temporalio.common import Priority

from rolloutd.polar import PolarTaskRequest, priority_of, to_task_request
from rolloutd.types import TaskRequest
from rolloutd.workers.capacity import RuntimeSlots
from rolloutd.workflows.tenants import task_priority

BASE = {"task_id": "t1", "instruction": "x", "harness": {"type": "shell", "command": "true"}}


def test_a_task_carries_tenant_priority_and_weight_to_temporal() -> None:
    task = TaskRequest.model_validate(
        {**BASE, "tenant": "eval-run", "priority": 1, "fairness_weight": 2.5}
    )
    assert task_priority(task) == Priority(
        priority_key=1, fairness_key="eval-run", fairness_weight=2.5
    )
    default = TaskRequest.model_validate(BASE)
    assert task_priority(default) == Priority(
        priority_key=3, fairness_key="default", fairness_weight=1.0
    )


@pytest.mark.parametrize(
    "field,value",
    [("priority", 0), ("priority", 6), ("tenant", "a/b"), ("tenant", ""), ("fairness_weight", 0)],
)
def test_bad_tenancy_fields_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(pydantic.ValidationError, match=field):
        TaskRequest.model_validate({**BASE, field: value})


def test_polar_dispatch_priority_maps_to_priority() -> None:
    assert [priority_of(d) for d in (-5, -1, 0, 1, 2, 9)] == [5, 4, 3, 2, 1, 1]
    polar = {
        "task_id": "p1",
        "instruction": "x",
        "agent": {"harness": "shell"},
        "dispatch_priority": 2,
    }
    assert to_task_request(PolarTaskRequest.model_validate(polar))["priority"] == 1
    # rolloutd's own priority wins; the tenant passes through
    own = to_task_request(
        PolarTaskRequest.model_validate({**polar, "priority": 4, "tenant": "job-7"})
    )
    assert (own["priority"], own["tenant"]) == (4, "job-7")
    assert "priority" not in to_task_request(
        PolarTaskRequest.model_validate(
            {k: v for k, v in polar.items() if k != "dispatch_priority"}
        )
    )


async def test_runtime_slots_wait_while_live_runtimes_fill_the_host() -> None:
    live: list[str] = []
    slots = RuntimeSlots(2, lambda: len(live))
    ctx = None  # the supplier does not read the context
    first = await slots.reserve_slot(ctx)  # type: ignore[arg-type]
    await slots.reserve_slot(ctx)  # type: ignore[arg-type]
    assert slots.try_reserve_slot(ctx) is None  # type: ignore[arg-type]
    third = asyncio.ensure_future(slots.reserve_slot(ctx))  # type: ignore[arg-type]
    # both provisionings end with a runtime each: still full
    live += ["r1", "r2"]
    slots.release_slot(_Release(first))
    slots.release_slot(_Release(first))
    await asyncio.sleep(0.05)
    assert not third.done()
    # a teardown makes room, from another thread too
    live.pop()
    await asyncio.to_thread(slots.notify)
    await asyncio.wait_for(third, 5)
    assert slots.reserved == 1


class _Release:
    def __init__(self, permit: object) -> None:
        self.permit, self.slot_info = permit, None


def test_runtime_slots_refuse_a_limit_below_one() -> None:
    with pytest.raises(ValueError, match="limit"):
        RuntimeSlots(0, lambda: 0)
    with pytest.raises(ValueError, match="max_reserved"):
        RuntimeSlots(4, lambda: 0, max_reserved=0)


async def test_runtime_slots_bound_provisionings_at_once_within_the_limit() -> None:
    slots = RuntimeSlots(10, lambda: 0, max_reserved=2)
    ctx = None
    await slots.reserve_slot(ctx)  # type: ignore[arg-type]
    permit = await slots.reserve_slot(ctx)  # type: ignore[arg-type]
    assert slots.try_reserve_slot(ctx) is None  # type: ignore[arg-type]
    slots.release_slot(_Release(permit))
    assert slots.try_reserve_slot(ctx) is not None  # type: ignore[arg-type]
