"""Backend-pool admin over the gateway's ``/admin/...`` routes (bearer token), for trainers.

A trainer syncs weights like this (ProRL Agent's pause / update / resume cycle)::

    admin = BackendAdmin("http://gateway:8300", token)
    await admin.pause()                       # new requests wait; running ones drain
    ...push new weights to the inference servers...
    await admin.set_policy_version(step + 1)  # stamped on every later completion
    await admin.resume()

Routes used (the gateway's admin API; this client is their only caller here)::

    GET    /admin/backends                    list: [{name, type, url, policy_version, ...}]
    POST   /admin/backends                    add {url, type, name?, policy_version?,
                                              logprob_mode?, return_routed_experts?,
                                              routed_experts_shape?}
    DELETE /admin/backends/{name}             remove one
    DELETE /admin/backends                    clear the pool
    POST   /admin/backends/pause              {names?: [...]}: pause (all when omitted)
    POST   /admin/backends/resume             {names?: [...]}
    POST   /admin/policy_version              {policy_version, names?: [...]}
    POST   /admin/engine/load                 {model_file, policy_version, timeout_s?}

Errors: any non-2xx answer raises :class:`AdminError` with the status and the gateway's body.
"""

from __future__ import annotations

from typing import Any

import httpx

from rolloutd.errors import RolloutdError
from rolloutd.http_client import CONTROL, new_async_client
from rolloutd.settings import find_admin_token
from rolloutd.types import LogprobMode


class AdminError(RolloutdError):
    """The gateway refused an admin call. ``status_code`` is its HTTP status."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message, retryable=status_code >= 500)
        self.status_code = status_code


class BackendAdmin:
    """Async client of the gateway's backend-pool admin routes.

    Args:
        gateway_url: the gateway's base URL, e.g. ``http://127.0.0.1:8300``.
        token: the gateway's admin bearer token; None: ``$ROLLOUTD_ADMIN_TOKEN``, else the
            token ``rolloutd up`` generated for its stack
            (:func:`rolloutd.settings.find_admin_token`).
        transport: an httpx transport (tests: ``httpx.ASGITransport(app=...)``).
        timeout_s: limit of one call (pause waits for the drain).
    """

    def __init__(
        self,
        gateway_url: str,
        token: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        token = token or find_admin_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = new_async_client(
            CONTROL,
            timeout_s=timeout_s,
            base_url=gateway_url.rstrip("/"),
            headers=headers,
            transport=transport,
        )

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.http.aclose()

    async def __aenter__(self) -> BackendAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        response = await self.http.request(method, path, json=body)
        if response.status_code >= 300:
            raise AdminError(
                f"{method} {path}: {response.status_code} {response.text[:500]}",
                response.status_code,
            )
        return response.json() if response.content else None

    async def list(self) -> list[dict[str, Any]]:
        """The backends: name, type, URL, policy version, paused, sessions assigned."""
        out = await self._call("GET", "/admin/backends")
        return out.get("backends", out) if isinstance(out, dict) else out

    async def add(
        self,
        url: str,
        *,
        type: str = "llama_cpp",
        name: str | None = None,
        policy_version: int | None = None,
        logprob_mode: LogprobMode | None = None,
        return_routed_experts: bool = False,
        routed_experts_shape: tuple[int, int] | None = None,
    ) -> dict[str, Any]:
        """Register a backend (new sessions go to the least-assigned one).

        Args:
            url: its base URL.
            type: its kind (``llama_cpp``, ``vllm``, ``sglang``, ``openai``, ``verl``).
            name: its name (default: the URL).
            policy_version: the version it serves (default 0).
            logprob_mode: what its logprobs are when the server runs otherwise than its
                kind's default (``raw``, ``temperature``, ``processed``; docs/backends.md);
                None: its kind's.
            return_routed_experts: sglang: ask every call for its routed experts (R3).
            routed_experts_shape: sglang: ``(num_hidden_layers, num_experts_per_tok)``.

        Returns:
            The backend as the admin list shows it.
        """
        body: dict[str, Any] = {"url": url, "type": type}
        if name is not None:
            body["name"] = name
        if policy_version is not None:
            body["policy_version"] = policy_version
        if logprob_mode is not None:
            body["logprob_mode"] = logprob_mode
        if return_routed_experts:
            body["return_routed_experts"] = True
        if routed_experts_shape is not None:
            body["routed_experts_shape"] = list(routed_experts_shape)
        return await self._call("POST", "/admin/backends", body)

    async def remove(self, name: str) -> Any:
        """Remove one backend."""
        return await self._call("DELETE", f"/admin/backends/{name}")

    async def clear(self) -> Any:
        """Remove every backend."""
        return await self._call("DELETE", "/admin/backends")

    async def pause(
        self, names: list[str] | None = None, *, drain_timeout_s: float | None = None
    ) -> Any:
        """Pause backends (all by default) for a weight sync: in-flight calls drain.

        Args:
            names: backends to pause (None: all).
            drain_timeout_s: bound on the wait for calls in flight, s (None: the gateway's
                ``drain_timeout_s``).

        Returns:
            ``{backends, paused, drained, num_in_flight}``.
        """
        body = _names(names)
        if drain_timeout_s is not None:
            body["drain_timeout_s"] = drain_timeout_s
        return await self._call("POST", "/admin/backends/pause", body)

    async def resume(self, names: list[str] | None = None) -> Any:
        """Resume paused backends."""
        return await self._call("POST", "/admin/backends/resume", _names(names))

    async def set_policy_version(self, policy_version: int, names: list[str] | None = None) -> Any:
        """Set the policy version stamped on completions (all backends by default)."""
        return await self._call(
            "POST", "/admin/policy_version", {"policy_version": policy_version, **_names(names)}
        )

    async def load_engine(
        self, model_file: str, policy_version: int, *, timeout_s: float = 120.0
    ) -> dict[str, Any]:
        """Reload the local engine of ``rolloutd up`` on ``model_file`` (a GGUF path on the
        engine's machine) and return once it serves it.

        Returns:
            ``{model_file, policy_version, duration_s}`` (duration of the reload, s).

        Raises:
            AdminError: 409 (no local engine behind this gateway, or a lower version than the
                one served), 400 (no such file), 503 (the engine did not come back).
        """
        response = await self.http.post(
            "/admin/engine/load",
            json={
                "model_file": model_file,
                "policy_version": policy_version,
                "timeout_s": timeout_s,
            },
            timeout=timeout_s + 60.0,
        )
        if response.status_code >= 300:
            raise AdminError(
                f"POST /admin/engine/load: {response.status_code} {response.text[:500]}",
                response.status_code,
            )
        return response.json()


def _names(names: list[str] | None) -> dict[str, Any]:
    return {"names": names} if names is not None else {}
