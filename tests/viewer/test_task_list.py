"""The viewer's list of runs (``GET /view/tasks``) in headless Debian Chromium: four tasks of
one tenant on the shared fleets (shell sessions in the local runtime, no model call: one
wins, one loses, one whose harness is missing, one whose runtime's prepare step fails), read
back from Temporal's visibility.

Filtering by failure kind through the page's own form shows only the tasks with a session of
that kind, each linking to its task page and to the failed session's page; the unfiltered
list (the control) shows all four; a reward bound and a tenant token narrow it too.
``ROLLOUTD_VIEWER_SCREENSHOTS=1`` also saves docs/viewer_tasks_harness.png (filtered by failure
kind) and docs/viewer_tasks.png (the tenant's whole list).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

import httpx
import pytest

from rolloutd.viewer import add_viewer_routes, session_href, task_href, tasks_href
from rolloutd.viewer.runs import TaskFilter, list_runs
from tests.support.browser import Chromium, chromium_binary
from tests.support.buffer_tasks import local_task, poll
from tests.support.served import served

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.timeout(600),
    pytest.mark.skipif(chromium_binary() is None, reason="chromium is not installed"),
]

ROOT = Path(__file__).parents[2]

#: what each row of the list says, read by its ``data-*`` attributes
ROWS_JS = (
    "Object.fromEntries([...document.querySelectorAll('#tasks tr[data-task]')].map(r => ["
    "r.dataset.task, {status: r.querySelector('[data-k=status]').textContent,"
    " reward: r.querySelector('[data-k=mean_reward]').textContent,"
    " task_link: r.querySelector('td a').getAttribute('href'),"
    " failures: [...r.querySelectorAll('[data-failure]')].map(a =>"
    " [a.dataset.failure, a.getAttribute('href')])}]))"
)


def app_of(fleets, tenant_of=None):
    from fastapi import FastAPI

    from rolloutd.store import BlobStore
    from rolloutd.trainer_client import RolloutClient

    app = FastAPI()
    add_viewer_routes(
        app, RolloutClient(fleets.client, BlobStore(fleets.store_url)), tenant_of=tenant_of
    )
    return app


@contextlib.asynccontextmanager
async def facade(fleets):
    """The viewer's routes served over real HTTP for the browser."""
    async with served(app_of(fleets), timeout_s=30) as url:
        yield url


async def test_the_list_filters_tasks_by_failure_kind_in_chromium(fleets):
    from rolloutd.trainer_client import RolloutClient

    u = uuid.uuid4().hex[:6]
    tenant = f"list-{u}"
    tasks = {
        "won": local_task(f"won-{u}", "touch won"),
        "lost": local_task(f"lost-{u}", "true"),
        "harness": local_task(f"harness-{u}", "./no-such-script.sh"),
        "sandbox": local_task(f"sandbox-{u}", "true")
        | {"runtime": {"type": "local", "prepare": [{"type": "exec", "command": "exit 3"}]}},
    }
    client = RolloutClient(fleets.client)
    handles = {
        name: await client.submit(task | {"tenant": tenant}, check_capabilities=False)
        for name, task in tasks.items()
    }
    results = {name: await handle.result() for name, handle in handles.items()}
    ids = {name: task["task_id"] for name, task in tasks.items()}
    # the tasks ended as meant (what the list must show)
    assert [s.reward for s in results["won"].sessions] == [1.0]
    assert [s.reward for s in results["lost"].sessions] == [0.0]
    for kind in ("harness", "sandbox"):
        [session] = results[kind].sessions
        assert session.failure is not None and session.failure.kind == kind, session
    failed_session = {kind: results[kind].sessions[0].session_id for kind in ("harness", "sandbox")}
    # Temporal's visibility is eventually consistent: wait until it holds what ended
    await poll(
        lambda: list_runs(fleets.client, TaskFilter(tenant=tenant)),
        lambda listing: (
            len(listing.rows) == 4
            and all(row.closed_at is not None for row in listing.rows)
            and sum(len(row.failed_sessions) for row in listing.rows) == 2
            and sum(row.mean_reward is not None for row in listing.rows) == 2
        ),
        what="the four tasks in Temporal's visibility",
    )
    async with facade(fleets) as base, Chromium() as browser:
        # control: the tenant's whole list
        await browser.open(base + tasks_href(tenant=tenant))
        every = await browser.evaluate(ROWS_JS)
        assert set(every) == set(ids.values())
        assert every[ids["won"]]["reward"] == "1" and every[ids["lost"]]["reward"] == "0"
        for name, task_id in ids.items():
            assert every[task_id]["task_link"] == task_href(task_id)
            assert every[task_id]["status"] == "completed"
            failed = failed_session.get(name)
            expected = [[name, session_href(failed)]] if failed else []
            assert every[task_id]["failures"] == expected, name
        # the page's own form, failure kind "harness": what the browser would submit
        query = await browser.evaluate(
            "(() => { const f = document.getElementById('filters');"
            " f.querySelector('select[name=failure]').value = 'harness';"
            " return new URLSearchParams(new FormData(f)).toString(); })()"
        )
        await browser.open(f"{base}/view/tasks?{query}")
        only = await browser.evaluate(ROWS_JS)
        assert list(only) == [ids["harness"]], only
        assert only[ids["harness"]]["failures"] == [
            ["harness", session_href(failed_session["harness"])]
        ]
        assert (
            await browser.evaluate("document.querySelector('select[name=failure]').value")
            == "harness"
        )
        if os.environ.get("ROLLOUTD_VIEWER_SCREENSHOTS"):
            await browser.screenshot(ROOT / "docs" / "viewer_tasks_harness.png", selector="body")
            await browser.open(base + tasks_href(tenant=tenant))
            await browser.screenshot(ROOT / "docs" / "viewer_tasks.png", selector="body")
        # the failed session's link opens its page
        await browser.open(base + session_href(failed_session["harness"]))
        assert "failure harness" in await browser.evaluate("document.body.textContent")
        # a reward bound: the winner only
        await browser.open(base + tasks_href(tenant=tenant, min_reward=1))
        assert list(await browser.evaluate(ROWS_JS)) == [ids["won"]]

    # a tenant's token lists its own tenant's tasks only, whatever the query asks; a malformed
    # filter is refused, naming the field
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app_of(fleets, tenant_of=lambda request: "other")),
        base_url="http://viewer",
    ) as http:
        page = await http.get(tasks_href(tenant=tenant))
        assert page.status_code == 200 and 'data-task="' not in page.text
        bad = await http.get(tasks_href(failure="gremlins"))
        assert bad.status_code == 422 and "failure" in bad.text
