"""``rolloutd view ID``: the trace viewer's page of a session (``{task_id}/{index}``) or of a
task (an id without ``/``).

When a REST facade answers at ``--url`` (``rolloutd rest``), its page is opened. Otherwise
this command serves the viewer itself on ``127.0.0.1`` (a free port) against Temporal and the
blob store until Ctrl-C. Either way it prints the page's URL and opens it in a browser when
one is available (Python's ``webbrowser``: ``$BROWSER``, xdg-open, ...); on a machine without
one the URL is the output.
"""

from __future__ import annotations

import asyncio
import sys
import webbrowser

import httpx

from rolloutd.http_client import CONTROL, new_async_client
from rolloutd.viewer.pages import session_href, task_href


def view_path(view_id: str) -> str:
    """The viewer path of a session id or a task id."""
    return session_href(view_id) if "/" in view_id else task_href(view_id)


def _open_browser(url: str) -> bool:
    """Open ``url`` in a browser when one is available; whether one was."""
    try:
        webbrowser.get()
    except webbrowser.Error:
        return False
    return webbrowser.open(url)


def _facade_answers(base_url: str) -> bool:
    try:
        return httpx.get(base_url.rstrip("/") + "/openapi.json", timeout=3.0).status_code == 200
    except httpx.HTTPError:
        return False


def main(
    view_id: str, *, url: str, address: str, store_url: str, namespace: str, viewer_model: str
) -> int:
    """Entry point of ``rolloutd view``.

    Args:
        view_id: a session id or a task id.
        url: base URL of a running REST facade.
        address, store_url, namespace: where to read from when this command serves itself.
        viewer_model: tokenizer when a completion's model is not in the catalog.

    Returns:
        0 once the page was printed (and, when serving, after Ctrl-C); 1 when the page
        answers with an error (an unknown id), which is printed.
    """
    if _facade_answers(url):
        page = url.rstrip("/") + view_path(view_id)
        answer = httpx.get(page, timeout=60.0)
        if answer.status_code != 200:
            print(
                f"rolloutd view: {page}: {answer.status_code} {answer.text[:300]}", file=sys.stderr
            )
            return 1
        print(page, flush=True)
        _open_browser(page)
        return 0
    return asyncio.run(
        _serve(
            view_id,
            address=address,
            store_url=store_url,
            namespace=namespace,
            viewer_model=viewer_model,
        )
    )


async def _serve(
    view_id: str, *, address: str, store_url: str, namespace: str, viewer_model: str
) -> int:
    import uvicorn
    from fastapi import FastAPI

    from rolloutd.trainer_client import RolloutClient
    from rolloutd.viewer.routes import add_viewer_routes

    client = await RolloutClient.connect(address, namespace=namespace, store_url=store_url)
    app = FastAPI(title="rolloutd trace viewer")
    add_viewer_routes(app, client, default_model=viewer_model)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            return await serving or 1
        await asyncio.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    page = f"http://127.0.0.1:{port}{view_path(view_id)}"
    async with new_async_client(CONTROL) as http:
        answer = await http.get(page)
    if answer.status_code != 200:
        print(f"rolloutd view: {page}: {answer.status_code} {answer.text[:300]}", file=sys.stderr)
        server.should_exit = True
        await serving
        return 1
    print(f"{page}\n(serving the viewer until Ctrl-C)", flush=True)
    _open_browser(page)
    await serving
    return 0
