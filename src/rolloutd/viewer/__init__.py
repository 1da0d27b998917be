"""The trace viewer: server-rendered pages of the tasks, of a task and of a session, token by
token (docs/viewer.md). Served by the REST facade; ``rolloutd view SESSION_ID`` opens one."""

from rolloutd.viewer.pages import (
    session_href,
    session_page,
    task_href,
    task_page,
    tasks_href,
    tasks_page,
)
from rolloutd.viewer.routes import add_viewer_routes, task_id_of
from rolloutd.viewer.tokens import TokenText

__all__ = [
    "TokenText",
    "add_viewer_routes",
    "session_href",
    "session_page",
    "task_href",
    "task_id_of",
    "task_page",
    "tasks_href",
    "tasks_page",
]
