"""What ``benchmarks/orchestration.py`` reads: each process's CPU from ``/proc``, the Temporal
dev server's request counters from its Prometheus endpoint, and what the workflows' histories
hold (events, bytes, payload bytes, and what each event asked of Temporal).

Each reads what the operating system or Temporal itself keeps; none needs anything of the
processes it measures.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

#: seconds per clock tick of ``/proc/{pid}/stat``'s times
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

# ------------------------------------------------------------------------------- CPU


@dataclass(frozen=True)
class ProcCPU:
    """One process's CPU so far, s: its own (all threads) and its children's (reaped ones and
    live descendants not measured on their own)."""

    own_s: float
    children_s: float


def _proc_table() -> dict[int, tuple[int, float, float]]:
    """Every process: pid -> (ppid, own CPU s, reaped children's CPU s), from
    ``/proc/{pid}/stat`` (proc(5): fields 4, 14-17, after the command name)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        utime, stime, cutime, cstime = (int(x) * TICK_S for x in fields[11:15])
        table[int(entry)] = (int(fields[1]), utime + stime, cutime + cstime)
    return table


def cpu_snapshot(pids: dict[str, int]) -> dict[str, ProcCPU]:
    """CPU so far of each named process (name -> pid), children included; a descendant that
    is itself named counts only under its own name.

    Raises:
        SystemExit: a named process is gone.
    """
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    named = set(pids.values())
    out = {}
    for name, pid in pids.items():
        if pid not in table:
            raise SystemExit(f"{name} (pid {pid}) is gone")
        _, own, reaped = table[pid]
        below, todo = reaped, list(children.get(pid, []))
        while todo:
            p = todo.pop()
            if p in named or p not in table:
                continue
            below += table[p][1] + table[p][2]
            todo += children.get(p, [])
        out[name] = ProcCPU(own, below)
    return out


def cpu_delta(before: dict[str, ProcCPU], after: dict[str, ProcCPU]) -> dict[str, ProcCPU]:
    """CPU spent between two snapshots, s, by process."""
    return {
        name: ProcCPU(after[name].own_s - b.own_s, after[name].children_s - b.children_s)
        for name, b in before.items()
    }


# ---------------------------------------------------------------- the server's metrics


def listening_ports(pid: int) -> list[int]:
    """TCP ports process ``pid`` listens on (its socket inodes in ``/proc/{pid}/fd`` against
    ``/proc/{pid}/net/tcp{,6}`` rows in state 0A, LISTEN: proc(5))."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def find_metrics_url(pid: int) -> str:
    """The dev server's Prometheus endpoint: ``temporal server start-dev`` serves
    ``/metrics`` on a random free port unless ``--metrics-port`` is given, so each port it
    listens on is asked.

    Raises:
        SystemExit: none answers with Temporal's ``service_requests``.
    """
    for port in listening_ports(pid):
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            response = httpx.get(url, timeout=5)
        except httpx.HTTPError:
            continue  # gRPC ports do not speak HTTP/1.1
        if response.status_code == 200 and "service_requests" in response.text:
            return url
    raise SystemExit(f"no /metrics among the Temporal server's ports {listening_ports(pid)}")


def server_counts(url: str) -> Counter[str]:
    """The frontend's requests by operation (``service_requests``,
    ``service_name="frontend"``) and the persistence requests in all
    (``persistence_requests``), counted so far."""
    counts: Counter[str] = Counter()
    text = httpx.get(url, timeout=30).raise_for_status().text
    for family in text_string_to_metric_families(text):
        # a counter's samples are named ``{family}_total`` by the parser
        for sample in family.samples:
            if family.name == "service_requests" and sample.labels.get("service_name") == (
                "frontend"
            ):
                counts[sample.labels.get("operation", "?")] += sample.value
            elif family.name == "persistence_requests":
                counts[PERSISTENCE] += sample.value
    return counts


PERSISTENCE = "(persistence requests)"

# ----------------------------------------------------------------------- histories


def _event_name(event_type: int) -> str:
    """``EVENT_TYPE_ACTIVITY_TASK_SCHEDULED`` -> ``ActivityTaskScheduled``."""
    words = EventType.Name(event_type).removeprefix("EVENT_TYPE_").split("_")
    return "".join(w.capitalize() for w in words)


def payload_bytes(message: Any) -> int:
    """Bytes of every ``temporal.api.common.v1.Payload`` inside a protobuf message (data and
    metadata, as serialized), at any depth."""
    total = 0
    for fd, value in message.ListFields():
        if fd.message_type is None:
            continue
        if fd.message_type.GetOptions().map_entry:
            items: Iterable[Any] = value.values()
        elif fd.is_repeated:
            items = value
        else:
            items = (value,)
        for item in items:
            if isinstance(item, Payload):
                total += item.ByteSize()
            elif hasattr(item, "ListFields"):
                total += payload_bytes(item)
    return total


def _local_activity_type(event: Any) -> str:
    """The activity type of a local activity's marker (the SDK core's marker data, JSON),
    or ``?``."""
    try:
        data = event.marker_recorded_event_attributes.details["data"].payloads[0].data
        return str(json.loads(data).get("activity_type") or "?")
    except (KeyError, IndexError, ValueError, AttributeError):
        return "?"


def ask(event: Any) -> str | None:
    """What one history event says a workflow asked of Temporal, as a row name of the
    breakdown (None: nothing to list)."""
    name = _event_name(event.event_type)
    if name == "ActivityTaskScheduled":
        return f"activity `{event.activity_task_scheduled_event_attributes.activity_type.name}`"
    if name == "MarkerRecorded":
        marker = event.marker_recorded_event_attributes.marker_name
        if marker == "core_local_activity":
            return f"local activity `{_local_activity_type(event)}`"
        return f"marker `{marker}`"
    if name == "WorkflowExecutionSignaled":
        return f"signal received `{event.workflow_execution_signaled_event_attributes.signal_name}`"
    if name == "SignalExternalWorkflowExecutionInitiated":
        attrs = event.signal_external_workflow_execution_initiated_event_attributes
        return f"signal sent `{attrs.signal_name}`"
    if name == "UpsertWorkflowSearchAttributes":
        fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes
        return "search attributes upserted: " + ", ".join(sorted(fields.indexed_fields))
    if name == "WorkflowPropertiesModified":
        return "memo upserted"
    if name == "StartChildWorkflowExecutionInitiated":
        attrs = event.start_child_workflow_execution_initiated_event_attributes
        return f"child workflow `{attrs.workflow_type.name}`"
    if name == "TimerStarted":
        return "timer"
    if name in ("WorkflowTaskCompleted", "WorkflowTaskFailed", "WorkflowTaskTimedOut"):
        return "workflow task" + ("" if name == "WorkflowTaskCompleted" else f" ({name})")
    if name in ("ActivityTaskFailed", "ActivityTaskTimedOut", "ActivityTaskCanceled"):
        return name
    return None


@dataclass
class HistoryProfile:
    """What the histories of one phase hold, by workflow kind (``session``, ``task``,
    ``other``: every other workflow with an event in the phase, such as the fleet registry)."""

    events: Counter[str] = field(default_factory=Counter)
    history_bytes: Counter[str] = field(default_factory=Counter)
    payload_bytes: Counter[str] = field(default_factory=Counter)
    #: event type -> count, in sessions' and tasks' histories
    by_type: Counter[str] = field(default_factory=Counter)
    #: event type -> payload bytes, in sessions' and tasks' histories
    payload_by_type: Counter[str] = field(default_factory=Counter)
    #: (kind, what was asked) -> count: :func:`ask`'s rows
    asks: Counter[tuple[str, str]] = field(default_factory=Counter)
    workflows: Counter[str] = field(default_factory=Counter)


async def read_histories(
    client: Client, kinds: dict[str, str], t0: float, t1: float
) -> HistoryProfile:
    """Every workflow execution with an event between ``t0`` and ``t1`` (epoch s), its
    events in that window counted (Temporal's visibility list, then each run's history)."""
    start, end = datetime.fromtimestamp(t0, UTC), datetime.fromtimestamp(t1, UTC)
    runs = [
        w
        async for w in client.list_workflows()
        if w.start_time <= end and (w.close_time is None or w.close_time >= start)
    ]
    profile = HistoryProfile()
    gate = asyncio.Semaphore(8)

    async def one(wf: Any) -> None:
        kind = kinds.get(wf.workflow_type, "other")
        async with gate:
            history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        counted = False
        for event in history.events:
            at = event.event_time.ToDatetime(UTC)
            if not start <= at <= end:
                continue
            counted = True
            name = _event_name(event.event_type)
            profile.events[kind] += 1
            profile.history_bytes[kind] += event.ByteSize()
            size = payload_bytes(event)
            profile.payload_bytes[kind] += size
            if kind != "other":
                profile.by_type[name] += 1
                profile.payload_by_type[name] += size
            asked = ask(event)
            if asked is not None:
                profile.asks[(kind, asked)] += 1
        if counted:
            profile.workflows[kind] += 1

    await asyncio.gather(*(one(w) for w in runs))
    return profile
