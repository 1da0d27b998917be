"""What ``rolloutd status`` shows (:mod:`rolloutd.cli.commands.status` prints it): the running
stack as its supervisor records it (``stack.json``), plus what only the live services know:
whether each engine answers, and as its kind
(:func:`rolloutd.stack.engine_check.check_engine`: the stack's own llama-server, or every
URL of an engine it does not run), the engine's busy slots (llama-server ``/slots``), the
sessions in flight by phase (Temporal: running ``RolloutSessionWorkflow`` executions, each
asked its ``phase`` query), and the failure counts by kind of the running and recent tasks.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
from pydantic import BaseModel, Field

from rolloutd.settings import GatewaySettings, engine_api_key_file
from rolloutd.stack.engine_check import EngineCheck
from rolloutd.stack.engine_check import check_engines as ask_engines
from rolloutd.stack.inflight import TaskFailures, sessions_by_phase, task_failures
from rolloutd.stack.state import StackState, read_state
from rolloutd.trainer_client import RolloutClient


class StackStatus(BaseModel):
    """What ``rolloutd status`` shows.

    Attributes:
        state: the supervisor's record; each child's ``pid`` is None when it is not alive.
        uptime_s: per child name, seconds since its current process started.
        engines: what each engine URL answered (empty: not asked).
        busy_slots: engine slots processing a request now (None: not asked or no answer).
        sessions_by_phase: sessions in flight per phase (None: Temporal did not answer).
        temporal_error: why Temporal did not answer.
        tasks: running and recent tasks with their failure counts (None: not asked).
    """

    state: StackState
    uptime_s: dict[str, float] = Field(default_factory=dict)
    engines: list[EngineCheck] = Field(default_factory=list)
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


def _read_key(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def check_engines(state: StackState, home: Path | None = None) -> list[EngineCheck]:
    """Ask every engine of the stack whether it answers, and as its kind: the llama-server
    ``up`` runs (with the API key it keeps in ``home``), or each URL of the engine it uses
    without running it (with ``ROLLOUTD_BACKEND_API_KEY``, as the gateway sends it).

    Returns:
        One check per URL, in the stack's order; empty when the stack names no engine.
    """
    if state.engine is not None:
        asks = [("llama_cpp", state.engine.url, _read_key(engine_api_key_file(home)))]
    elif state.external_engine is not None:
        key = GatewaySettings().backend_api_key
        asks = [(state.external_engine.kind, url, key) for url in state.external_engine.urls]
    else:
        return []
    return ask_engines(asks)


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
    status.engines = check_engines(state, home)
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
