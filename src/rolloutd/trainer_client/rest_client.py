"""The trainer's client of the REST facade, carrying its tenant token.

A trainer that holds Temporal and blob-store credentials uses :class:`RolloutClient` and is the
operator of what it reaches (docs/security.md, "Tenant tokens"); a tenant reaches rolloutd
through the REST facade with its tenant token, which this client sends on every call::

    async with RestClient("https://rollouts.example.com") as rest:   # $ROLLOUTD_TENANT_TOKEN
        answer = await rest.submit(polar_task)
        status = await rest.status(answer["task_id"])

Routes used: ``POST /rollout/task/submit``, ``GET`` and ``DELETE /rollout/task/{task_id}``,
``GET /rollout/tasks`` and ``GET /rollout/session/{session_id}/trajectory``.
Errors: any non-2xx answer raises :class:`RestError` with the status and the facade's body.
"""

from __future__ import annotations

from typing import Any

import httpx

from rolloutd.errors import RolloutdError
from rolloutd.http_client import CONTROL, new_async_client
from rolloutd.settings import HostSettings


class RestError(RolloutdError):
    """The REST facade refused a call. ``status_code`` is its HTTP status, ``detail`` its
    body's ``detail`` (for 422 and 403: the fields, by POLAR path)."""

    def __init__(self, status_code: int, detail: Any) -> None:
        super().__init__(f"REST facade answered {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class RestClient:
    """Async client of the REST facade's task routes.

    Args:
        base_url: the facade's base URL, e.g. ``http://127.0.0.1:8080``.
        token: the bearer token sent (a tenant token, or the operator's REST token); None:
            ``$ROLLOUTD_TENANT_TOKEN`` (none sent when unset: a loopback facade without tokens).
        transport: an httpx transport (tests: ``httpx.ASGITransport(app=...)``).
        timeout_s: limit of one call.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        token = token or HostSettings().tenant_token
        self.http = new_async_client(
            CONTROL,
            timeout_s=timeout_s,
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"} if token else None,
            transport=transport,
        )

    async def __aenter__(self) -> RestClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = await self.http.request(method, path, **kwargs)
        if not response.is_success:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = response.text
            raise RestError(response.status_code, detail)
        return response.json()

    async def submit(self, task: dict[str, Any]) -> dict[str, Any]:
        """Submit a POLAR task request.

        Returns:
            ``{"task_id", "status", "callback_secret"}``.

        Raises:
            RestError: 422 (a field refused, named), 403 (a tenant or priority the token does
                not allow), 409 (the task id was used).
        """
        return await self._call("POST", "/rollout/task/submit", json=task)

    async def status(self, task_id: str, *, traces: bool = True) -> dict[str, Any]:
        """The task's POLAR status (404 for a task of another tenant, as for an unknown one).

        Args:
            task_id: the task.
            traces: each session's traces too (read from the store: large); False: its
                result and rolloutd's summary (``metadata.rolloutd``) only.

        Raises:
            RestError: 404 and other refusals.
        """
        params = None if traces else {"traces": "false"}
        return await self._call("GET", f"/rollout/task/{task_id}", params=params)

    async def list_tasks(
        self, *, status: str | None = None, prefix: str | None = None, limit: int = 100
    ) -> dict[str, Any]:
        """The token's tenant's tasks (every task for the operator's token), newest first.

        Returns:
            ``{"tasks": [TaskRow, ...]}`` (:class:`rolloutd.trainer_client.listing.TaskRow`).

        Raises:
            RestError: 422 for a malformed filter, and other refusals.
        """
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = status
        if prefix is not None:
            params["prefix"] = prefix
        return await self._call("GET", "/rollout/tasks", params=params)

    async def trajectory(self, session_id: str) -> dict[str, Any]:
        """An ended session's trajectory (``Trajectory`` as JSON: traces, evaluation record,
        re-scores).

        Raises:
            RestError: 404 (not ended, unknown, another tenant's), 503 (no blob store).
        """
        return await self._call("GET", f"/rollout/session/{session_id}/trajectory")

    async def cancel(self, task_id: str) -> dict[str, Any]:
        """Cancel a task of the token's tenant; its status after cancellation was requested.

        Raises:
            RestError: 404 and other refusals.
        """
        return await self._call("DELETE", f"/rollout/task/{task_id}")
