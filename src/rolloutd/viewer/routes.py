"""The trace viewer's routes on the REST facade (``rolloutd rest``; ``rolloutd view`` opens
them)::

    GET /view/tasks                   the tasks, filtered (tenant, status, failure kind, mean
                                      reward, start time), newest first (HTML)
    GET /view/task/{task_id}          the task and its group of sessions (HTML)
    GET /view/session/{session_id}    a session: completions and traces, token by token (HTML)

Reads go through the trainer client (the task's status: queries and results, never raw
history) and its blob store (completion log, trajectory); the list of tasks from Temporal's
visibility (:mod:`rolloutd.viewer.runs`). Token ids are decoded with the
tokenizer of the model that sampled them: the completion's model when the catalog knows it,
else ``default_model`` (``ROLLOUTD_VIEWER_MODEL``, a catalog name or a tokenizer folder).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse
from pydantic import ValidationError

from rolloutd.engine.models import CATALOG, load_tokenizer
from rolloutd.errors import NotFoundError
from rolloutd.store import CompletionLog
from rolloutd.trainer_client.client import RolloutClient
from rolloutd.types import Completion, SessionResult, TaskProgress
from rolloutd.viewer.pages import session_page, task_page, tasks_page
from rolloutd.viewer.runs import TaskFilter, list_runs
from rolloutd.viewer.tokens import TokenText


def task_id_of(session_id: str) -> str:
    """The task of a session id (``{task_id}/{index}[/r{n}][.attempt-{k}]``; task ids hold no
    ``/``)."""
    return session_id.split("/", 1)[0]


def tokenizer_name(completions: list[Completion], default_model: str) -> str:
    """The catalog name of the model that sampled ``completions`` (by catalog or served name),
    else ``default_model``."""
    served = {entry.served_name: name for name, entry in CATALOG.items()}
    for c in completions:
        if c.model in CATALOG:
            return c.model
        if c.model in served:
            return served[c.model]
    return default_model


class _Tokenizers:
    """Loaded tokenizers by name (loading one takes about a second; pages reuse it)."""

    def __init__(self) -> None:
        self._loaded: dict[str, TokenText] = {}
        self._lock = asyncio.Lock()

    async def get(self, name: str) -> TokenText:
        async with self._lock:
            if name not in self._loaded:
                tokenizer = await asyncio.to_thread(load_tokenizer, name)
                self._loaded[name] = TokenText(tokenizer)
            return self._loaded[name]


def add_viewer_routes(
    app: FastAPI,
    client: RolloutClient,
    *,
    default_model: str = "qwen2.5-coder-0.5b",
    authorize: Callable[[Request, str], Awaitable[None]] | None = None,
    tenant_of: Callable[[Request], str | None] | None = None,
) -> None:
    """Serve the trace viewer's pages on ``app``.

    Args:
        app: the facade's app.
        client: its trainer client; session pages need ``client.store``.
        default_model: tokenizer for completions whose model the catalog does not know.
        authorize: called with the request and the task id before a page is made; raises
            ``HTTPException`` (404) when the caller may not view that task (a tenant token
            views its own tasks only: :func:`rolloutd.rest.create_app`).
        tenant_of: the caller's tenant when the caller is a tenant (its list shows that
            tenant's tasks only, whatever the query asks), None for the operator.

    Responses:
        200 HTML; 404 (HTML) for an unknown task or session; 422 for a malformed filter of
        the list; 503 when the client has no blob store (``--store-url``).
    """
    tokenizers = _Tokenizers()

    async def progress_of(task_id: str) -> TaskProgress:
        try:
            return await client.status(task_id)
        except NotFoundError:
            raise HTTPException(404, f"task {task_id} not found") from None

    @app.get("/view/tasks", response_class=HTMLResponse)
    async def view_tasks(request: Request) -> Any:
        """The list of tasks (:class:`~rolloutd.viewer.runs.TaskFilter` as the query)."""
        tenant = tenant_of(request) if tenant_of is not None else None
        query = dict(request.query_params)
        if tenant is not None:
            query["tenant"] = tenant
        try:
            where = TaskFilter.model_validate(query)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
            raise HTTPException(422, f"malformed filter: {problems}") from None
        listing = await list_runs(client.client, where)
        return HTMLResponse(tasks_page(listing, where, tenant_fixed=tenant is not None))

    @app.get("/view/task/{task_id}", response_class=HTMLResponse)
    async def view_task(task_id: str, request: Request) -> Any:
        """The task page."""
        if authorize is not None:
            await authorize(request, task_id)
        return HTMLResponse(task_page(await progress_of(task_id)))

    @app.get("/view/session/{session_id:path}", response_class=HTMLResponse)
    async def view_session(session_id: str, request: Request) -> Any:
        """The session page."""
        if authorize is not None:
            await authorize(request, task_id_of(session_id))
        progress = await progress_of(task_id_of(session_id))
        session = _find(progress, session_id)
        if client.store is None:
            raise HTTPException(503, "the facade has no blob store (--store-url)")
        completions = await asyncio.to_thread(
            CompletionLog(client.store, session.session_id).read_all
        )
        trajectory = (
            await asyncio.to_thread(client.trajectory, session) if session.trajectory_ref else None
        )
        tokens = await tokenizers.get(tokenizer_name(completions, default_model))
        page = await asyncio.to_thread(session_page, session, completions, trajectory, tokens)
        return HTMLResponse(page)


def _find(progress: TaskProgress, session_id: str) -> SessionResult:
    for session in [*progress.sessions, *progress.replaced]:
        if session.session_id == session_id:
            return session
    ended = ", ".join(s.session_id for s in progress.sessions) or "none"
    raise HTTPException(
        404,
        f"session {session_id} has not ended or does not exist "
        f"(ended sessions of task {progress.task_id}: {ended})",
    )
