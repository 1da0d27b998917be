"""A running task's ``status`` query, read page by page into one answer
(:meth:`rolloutd.trainer_client.RolloutClient.status`, and ``rolloutd status`` for running
tasks)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.client import WorkflowHandle

from rolloutd.types import StatusPage, TaskProgress
from rolloutd.workflows.task import STATUS_QUERY

#: a page start past every sample index and list position: that part of the page is empty
_PAST_THE_END = 2**31 - 1


async def query_status(
    handle: WorkflowHandle[Any, Any],
    *,
    rpc_timeout: timedelta | None = None,
    page_size: int | None = None,
) -> TaskProgress | None:
    """A running task's ``status`` query, every page of it: the ended and replaced sessions
    in all (None before the task's first workflow task ran).

    Pages are read one after another (``page_size`` sessions each, None: the workflow's);
    a session that ends between two reads shows in this call or the next, never twice.

    Raises:
        RPCError, WorkflowQueryFailedError: no worker answered, or the query failed.
    """

    async def page(first_sample: int = 0, first_replaced: int = 0) -> TaskProgress | None:
        return await handle.query(
            STATUS_QUERY,
            StatusPage(first_sample=first_sample, first_replaced=first_replaced, limit=page_size),
            result_type=TaskProgress,
            rpc_timeout=rpc_timeout,
        )

    last = await page()
    if last is None:
        return None
    sessions, replaced = list(last.sessions), list(last.replaced)
    # an answer of an earlier build has no counts: it holds every session
    while last.num_ended is not None and last.num_replaced is not None:
        more_sessions = bool(last.sessions) and len(sessions) < last.num_ended
        more_replaced = bool(last.replaced) and len(replaced) < last.num_replaced
        if not (more_sessions or more_replaced):
            break
        nxt = await page(
            sessions[-1].sample_index + 1 if more_sessions else _PAST_THE_END,
            len(replaced) if more_replaced else _PAST_THE_END,
        )
        if nxt is None:
            break
        sessions.extend(nxt.sessions)
        replaced.extend(nxt.replaced)
        last = nxt
    return last.model_copy(
        update={"sessions": sessions, "replaced": replaced, "num_ended": None, "num_replaced": None}
    )
