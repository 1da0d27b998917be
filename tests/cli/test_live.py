"""``rolloutd submit``'s live view on real parts (the shared fleets: real Temporal, real
llama-server, shell sessions in bwrap): plain lines when not on a terminal, a rich Live table
on one; either way the waited-for results come back unchanged."""

from __future__ import annotations

import io
import uuid

import pytest
from rich.console import Console

from rolloutd.cli.live import watch
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from tests.conftest import have_bwrap

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

#: one model call, then a pause so the view sees the run phase
ONE_CALL_THEN_WAIT = (
    'curl -sS -f -o reply.json "$OPENAI_BASE_URL/chat/completions" '
    "-H \"Authorization: Bearer $OPENAI_API_KEY\" -H 'Content-Type: application/json' "
    '-d \'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", '
    '"content": "hi"}]}\' && sleep 3'
)


def shell_task(task_id: str) -> dict:
    return {
        "task_id": task_id,
        "instruction": "say hi",
        "num_samples": 2,
        "harness": {"type": "shell", "command": ONE_CALL_THEN_WAIT},
        "runtime": {"type": "bwrap", "network": "gateway"},
        "evaluator": {"type": "session_completed"},
        "phases": {"run_s": 120},
    }


async def test_plain_lines_show_phases_completions_and_rewards(fleets):
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    handle = await client.submit(shell_task(f"live-{uuid.uuid4().hex[:6]}"))
    err = io.StringIO()
    group = await watch(
        client, [handle.task_id], handle.result(), tty=False, err=err, refresh_s=0.3
    )
    assert [s.status.value for s in group.sessions] == ["completed", "completed"]
    lines = err.getvalue().splitlines()
    assert lines and all(line.startswith(f"task {handle.task_id}: ") for line in lines)
    assert any("phases run " in line for line in lines), lines
    # the last look before the end, or the end itself: never more than the group has
    last = lines[-1]
    assert "/2 ended" in last
    ended = [s for s in group.sessions]
    final = (
        f"2/2 ended; phases ended 2; completions "
        f"{sum(s.num_completions for s in ended)}; rewards "
        + " ".join(f"{s.reward:g}" for s in ended)
    )
    # a final look after the end shows the whole group
    from rolloutd.cli.live import look

    assert (await look(client, handle.task_id)).line() == f"task {handle.task_id}: {final}"
    print("\n".join(lines))


async def test_a_terminal_gets_a_live_table_and_the_same_result(fleets):
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    handle = await client.submit(shell_task(f"live-tty-{uuid.uuid4().hex[:6]}"))
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160)
    group = await watch(
        client, [handle.task_id], handle.result(), tty=True, console=console, refresh_s=0.3
    )
    assert group == await handle.result()
    drawn = out.getvalue()
    assert "sessions by phase" in drawn and handle.task_id in drawn
    assert "run 2" in drawn or "run 1" in drawn, drawn[-3000:]
