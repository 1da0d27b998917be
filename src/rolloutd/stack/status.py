"""``rolloutd status``: the running stack as its supervisor records it (``stack.json``), plus
what only the live services know: the engine's busy slots (llama-server ``/slots``) and the
sessions in flight by phase (Temporal: running ``RolloutSessionWorkflow`` executions, each
asked its ``phase`` query), and the failure counts by kind of the running and recent tasks.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, Field

from rolloutd.processes import end_process
from rolloutd.settings import engine_api_key_file
from rolloutd.stack.inflight import TaskFailures, sessions_by_phase, task_failures
from rolloutd.stack.state import StackState, read_state
from rolloutd.trainer_client import RolloutClient


class StackStatus(BaseModel):
    """What ``rolloutd status`` shows.

    Attributes:
        state: the supervisor's record; each child's ``pid`` is None when it is not alive.
        uptime_s: per child name, seconds since its current process started.
        busy_slots: engine slots processing a request now (None: not asked or no answer).
        sessions_by_phase: sessions in flight per phase (None: Temporal did not answer).
        temporal_error: why Temporal did not answer.
        tasks: running and recent tasks with their failure counts (None: not asked).
    """

    state: StackState
    uptime_s: dict[str, float] = Field(default_factory=dict)
    busy_slots: int | None = None
    sessions_by_phase: dict[str, int] | None = None
    temporal_error: str | None = None
    tasks: list[TaskFailures] | None = None


def busy_slots(engine_url: str, home: Path | None = None) -> int | None:
    """How many of llama-server's slots process a request now (its ``GET /slots``, with the
    API key ``rolloutd up`` keeps in ``home``, when there is one)."""
    key_file = engine_api_key_file(home)
    headers = (
        {"Authorization": f"Bearer {key_file.read_text().strip()}"} if key_file.is_file() else {}
    )
    try:
        slots = httpx.get(f"{engine_url}/slots", headers=headers, timeout=2.0).json()
        return sum(bool(s.get("is_processing")) for s in slots)
    except (httpx.HTTPError, ValueError, TypeError, AttributeError):
        return None


async def _from_temporal(
    address: str, timeout_s: float = 10.0
) -> tuple[dict[str, int], list[TaskFailures]]:
    client = await asyncio.wait_for(RolloutClient.connect(address), timeout_s)
    return (
        await sessions_by_phase(client.client, timeout_s),
        await task_failures(client.client, timeout_s=timeout_s),
    )


def collect(home: Path, *, ask_services: bool = True) -> StackStatus | None:
    """The status of the stack on ``home``; None when no stack ever ran there.

    Args:
        home: the stack's home.
        ask_services: also ask the engine and Temporal (else the state file only).
    """
    state = read_state(home)
    if state is None:
        return None
    now = time.time()
    status = StackStatus(state=state)
    for child in state.children:
        if child.alive():
            status.uptime_s[child.name] = now - (child.started_at or now)
        else:
            child.pid = None
    if not ask_services or state.phase in ("stopped", "failed"):
        return status
    if state.engine is not None:
        status.busy_slots = busy_slots(state.engine.url, home)
    if state.temporal_address:
        try:
            status.sessions_by_phase, status.tasks = asyncio.run(
                _from_temporal(state.temporal_address)
            )
        except Exception as e:  # noqa: BLE001 -- shown, not raised: status must always print
            status.temporal_error = f"{type(e).__name__}: {e}"
    return status


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def render(status: StackStatus) -> str:
    """The status as the text ``rolloutd status`` prints."""
    st = status.state
    lines = [
        f"stack on {st.home}: {st.phase} (rolloutd up pid {st.pid}, supervision "
        f"{'on' if st.supervise else 'off'}, up {_duration(time.time() - st.started_at)})"
    ]
    if st.error:
        lines.append(f"error: {st.error}")
    lines.append(f"temporal {st.temporal_address}  ui {st.ui_url}  gateway {st.gateway_url}")
    rows = [("child", "phase", "pid", "uptime", "restarts", "last exit", "task queues")]
    for c in st.children:
        rows.append(
            (
                c.name,
                c.phase,
                str(c.pid or "-"),
                _duration(status.uptime_s.get(c.name)),
                str(c.restarts),
                "-" if c.last_exit_code is None else str(c.last_exit_code),
                ", ".join(c.task_queues) or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if st.engine is not None:
        e = st.engine
        slots = (
            f"{e.num_slots} slots"
            if status.busy_slots is None
            else f"slots {status.busy_slots}/{e.num_slots} busy"
        )
        lines.append(
            f"engine {e.model} ({e.model_file}), policy version {e.policy_version}, "
            f"{slots}, context {e.ctx_size} tokens"
        )
    elif st.backend_url:
        lines.append(f"backend {st.backend_url} (external)")
    if status.sessions_by_phase is not None:
        total = sum(status.sessions_by_phase.values())
        lines.append(
            f"sessions in flight: {total}"
            + (
                " (" + ", ".join(f"{p} {n}" for p, n in status.sessions_by_phase.items()) + ")"
                if total
                else ""
            )
        )
    elif status.temporal_error:
        lines.append(f"sessions in flight: unknown (Temporal: {status.temporal_error})")
    for task in status.tasks or []:
        failed = ", ".join(f"{kind} {n}" for kind, n in task.num_failed_by_kind.items())
        lines.append(
            f"task {task.task_id}: {task.status}, {task.num_sessions} sessions ended"
            f", failed: {failed or 'none'}"
        )
    return "\n".join(lines)


def main(home: Path, *, as_json: bool = False) -> int:
    """``rolloutd status``: print the status of the stack on ``home``.

    When it asked Temporal, it ends the process itself once the output is flushed
    (:func:`rolloutd.processes.end_process`): a short-lived process holding a Temporal client
    can abort in interpreter finalization ("PyGILState_Release ... finalizing",
    github.com/temporalio/sdk-python/issues/300), which turned a correct report into exit
    status -6.

    Returns:
        0 when the stack runs, 1 when it is stopped or failed, 2 when none ran on ``home``.
    """
    status = collect(home)
    if status is None:
        print(f"no stack has run on {home} (no {home / 'stack.json'})")
        return 2
    data: Any = status.model_dump(mode="json")
    print(json.dumps(data, indent=2) if as_json else render(status))
    code = 0 if status.state.phase in ("starting", "running") else 1
    if status.sessions_by_phase is not None or status.temporal_error is not None:
        end_process(code)
    return code
