"""What people look at: a real task (examples/agents/file_agent.py, the python harness under
bwrap, llama-server, the shared fleets of tests/conftest.py) seen through the Temporal CLI and
through the trace viewer's pages in headless Debian Chromium.

- ``temporal workflow describe`` of a finished session shows its summary and static details;
  ``temporal workflow metadata`` its current details (phase done, completions, reward).
- The task page lists the group with the numbers of the task's result; the session page shows
  every completion (dialect, backend, policy version, finish reason, timings) and every trace
  token by token: trainable and non-trainable tokens are drawn differently (computed styles),
  the counts and per-token arrays on the page equal the trajectory's, tool calls and results
  are shown as such.

``ROLLOUTD_VIEWER_SCREENSHOTS=1`` also saves docs/viewer_task.png and docs/viewer_session.png.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

import pytest

from rolloutd.stack import temporal_binary
from rolloutd.store import CompletionLog
from rolloutd.viewer import add_viewer_routes, session_href, task_href
from tests.conftest import have_bwrap
from tests.support.browser import Chromium, chromium_binary
from tests.support.harness_run import executed_tool_calls, hello_world_task, run_task
from tests.support.served import served

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

ROOT = Path(__file__).parents[2]
AGENT = ROOT / "examples" / "agents" / "file_agent.py"


@pytest.fixture(scope="module")
async def task_run(fleets):
    """One finished task of two tool-using sessions."""
    return await run_task(
        fleets,
        hello_world_task(
            "Use the write_file tool to create hello.py that prints hello world.",
            {
                "type": "python",
                "entry": "file_agent:agent",
                "max_turns": 2,
                "files": {"file_agent.py": AGENT.read_text()},
            },
            max_tokens=160,
        )
        | {"task_id": f"view-{uuid.uuid4().hex[:6]}", "num_samples": 2},
    )


@contextlib.asynccontextmanager
async def facade(fleets):
    """The REST facade with the viewer's routes, served over real HTTP for the browser."""

    from fastapi import FastAPI

    from rolloutd.store import BlobStore
    from rolloutd.trainer_client import RolloutClient

    app = FastAPI()
    add_viewer_routes(app, RolloutClient(fleets.client, BlobStore(fleets.store_url)))
    async with served(app, timeout_s=30) as url:
        yield url


async def temporal_cli(temporal_server, *args: str) -> str:
    """Run the ``temporal`` CLI without blocking this loop (the fleets' workers answer the
    metadata query from it)."""
    import asyncio

    proc = await asyncio.create_subprocess_exec(
        temporal_binary(),
        *args,
        "--address",
        temporal_server.address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_temporal_describe_shows_summary_and_details(task_run, temporal_server):
    session = task_run.group.sessions[0]
    workflow_id = f"task/{session.session_id}"
    described = await temporal_cli(
        temporal_server, "workflow", "describe", "--workflow-id", workflow_id
    )
    # the summary as it was set at start; the static details name the harness and evaluator
    summary = f"task {session.task_id} · sample {session.sample_index} · python"
    assert summary in described, described
    assert "harness: python" in described and "evaluator: test_on_output" in described
    task_described = await temporal_cli(
        temporal_server, "workflow", "describe", "--workflow-id", f"task/{session.task_id}"
    )
    assert f"task {session.task_id} · 2 samples · python" in task_described, task_described
    # current details: the built-in metadata query, answered by the workflow worker
    metadata = await temporal_cli(
        temporal_server, "workflow", "metadata", "--workflow-id", workflow_id
    )
    reward = "none" if session.reward is None else f"{session.reward:g}"
    for line in (
        "phase: done",
        f"completions: {session.num_completions}",
        f"status: {session.status.value}",
        f"reward: {reward}",
    ):
        assert line in metadata, metadata
    task_metadata = await temporal_cli(
        temporal_server, "workflow", "metadata", "--workflow-id", f"task/{session.task_id}"
    )
    assert "phase: done" in task_metadata and "sessions: 2/2 ended" in task_metadata
    print(described, metadata, task_metadata, sep="\n")


@pytest.mark.skipif(chromium_binary() is None, reason="chromium is not installed")
async def test_pages_in_chromium_show_the_trajectory(task_run, fleets):
    group = task_run.group
    run = next(
        (
            s
            for s in task_run.sessions
            if s.trajectory and s.trajectory.traces and executed_tool_calls(s.completions)
        ),
        task_run.sessions[0],
    )
    trajectory = run.trajectory
    assert trajectory is not None and trajectory.traces, run.result
    async with facade(fleets) as base, Chromium() as browser:
        load_s = await browser.open(base + task_href(group.task_id))
        rows = await browser.evaluate(
            "[...document.querySelectorAll('#sessions tr[data-session]')].map(r => ({"
            "id: r.dataset.session, reward: r.querySelector('[data-k=reward]').textContent,"
            "completions: +r.querySelector('[data-k=num_completions]').textContent,"
            "trainable: +r.querySelector('[data-k=num_trainable_tokens]').textContent,"
            "status: r.querySelector('[data-k=status]').textContent}))"
        )
        expected = [
            {
                "id": s.session_id,
                "reward": "none" if s.reward is None else str(s.reward),
                "completions": s.num_completions,
                "trainable": s.num_trainable_tokens,
                "status": s.status.value,
            }
            for s in sorted(group.sessions, key=lambda s: s.sample_index)
        ]
        assert rows == expected
        if os.environ.get("ROLLOUTD_VIEWER_SCREENSHOTS"):
            await browser.screenshot(ROOT / "docs" / "viewer_task.png", selector="body")

        page_s = await browser.open(base + session_href(run.result.session_id))
        completions = CompletionLog(_store(fleets), run.result.session_id).read_all()
        shown = await browser.evaluate(
            "[...document.querySelectorAll('#completions tr[data-completion]')].map(r => ["
            "r.querySelector('[data-k=dialect]').textContent,"
            "r.querySelector('[data-k=backend]').textContent,"
            "+r.querySelector('[data-k=policy_version]').textContent,"
            "+r.querySelector('[data-k=num_response_tokens]').textContent,"
            "r.querySelector('[data-k=finish_reason]').textContent,"
            "r.querySelector('[data-k=duration_s]').textContent])"
        )
        assert shown == [
            [
                c.dialect,
                c.backend,
                c.policy_version,
                len(c.response_ids),
                c.finish_reason,
                f"{c.timings.duration_s:.3f}",
            ]
            for c in completions
        ]
        for trace in trajectory.traces:
            n = trace.trace_index
            sel = f"section[data-trace-index='{n}']"
            data = await browser.evaluate(
                f"JSON.parse(document.getElementById('data-{n}').textContent)"
            )
            assert data["response_ids"] == trace.response_ids
            assert data["loss_mask"] == trace.loss_mask
            assert data["response_logprobs"] == trace.response_logprobs
            counts = await browser.evaluate(
                f'(() => {{ const s = document.querySelector("{sel}"); const k = n => '
                f"s.querySelector('[data-k=' + n + ']').textContent; return {{"
                f"prompt: +k('num_prompt_tokens'), response: +k('num_response_tokens'),"
                f"trainable: +k('num_trainable_tokens'), reward: k('reward'),"
                f"spans: s.querySelectorAll('[data-part=response] span').length,"
                f"prompt_spans: s.querySelectorAll('[data-part=prompt] span').length,"
                f"trainable_spans: s.querySelectorAll('[data-part=response] span[class^=k]')"
                f".length }}; }})()"
            )
            assert counts == {
                "prompt": len(trace.prompt_ids),
                "response": len(trace.response_ids),
                "trainable": sum(trace.loss_mask),
                "reward": "none" if trace.reward is None else str(trace.reward),
                "spans": len(trace.response_ids),
                "prompt_spans": len(trace.prompt_ids),
                "trainable_spans": sum(trace.loss_mask),
            }
            # drawn differently: the computed background of a trainable and of a
            # non-trainable response token (a prompt token when the response has none)
            styles = await browser.evaluate(
                f'(() => {{ const s = document.querySelector("{sel}");'
                f" const t = s.querySelector('[data-part=response] span[class^=k]');"
                f" const n = s.querySelector('[data-part=response] span.n')"
                f" || s.querySelector('[data-part=prompt] span:nth-child(2)');"
                f" const st = e => {{ const c = getComputedStyle(e); return"
                f" [c.backgroundColor, c.color]; }}; return [st(t), st(n)]; }})()"
            )
            assert styles[0] != styles[1], styles
        # the text on the page decodes to the sampled text of the first completion
        first = completions[0]
        page_text = await browser.evaluate(
            "document.querySelector('[data-part=response]').textContent"
        )
        assert first.response_text.strip()[:40] in page_text
        if executed_tool_calls(completions):
            calls = await browser.evaluate("document.querySelectorAll('.toolcall').length")
            results = await browser.evaluate("document.querySelectorAll('.toolresult').length")
            assert calls >= 1 and results >= 1
        hover = await browser.evaluate(
            "(() => { const s = document.querySelector('[data-part=response] span');"
            " s.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));"
            " return document.getElementById('hover').textContent; })()"
        )
        assert f"id {trajectory.traces[0].response_ids[0]}" in hover, hover
        if os.environ.get("ROLLOUTD_VIEWER_SCREENSHOTS"):
            await browser.evaluate(
                "document.querySelectorAll('details').forEach(d => d.open = true)"
            )
            await browser.screenshot(
                ROOT / "docs" / "viewer_session.png", selector="section.trace", max_height=1400
            )
        missing = await browser.open(base + "/view/session/no-such-task/0")
        assert "not found" in await browser.evaluate("document.body.textContent")
    print(
        f"viewer: task page {load_s:.2f} s, session page {page_s:.2f} s, missing {missing:.2f}"
        f" s; {sum(len(t.response_ids) for t in trajectory.traces)} response tokens"
    )


def _store(fleets):
    from rolloutd.store import BlobStore

    return BlobStore(fleets.store_url)


async def test_rolloutd_view_prints_the_page_and_refuses_an_unknown_id(task_run, fleets):
    import asyncio
    import sys

    session = task_run.group.sessions[0]
    env = {
        **os.environ,
        "BROWSER": "",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }

    async def view(view_id: str, base: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rolloutd.cli",
            "view",
            view_id,
            "--url",
            base,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        return proc.returncode, out.decode(), err.decode()

    async with facade(fleets) as base:
        code, out, err = await view(session.session_id, base)
        assert code == 0, err
        assert out.strip() == base + session_href(session.session_id)
        code, out, err = await view(f"{session.task_id}/9", base)
        assert code == 1 and "404" in err and "has not ended or does not exist" in err, err
