"""The gateway's admin routes: the durable backend pool (transport only; logic in the pool).

Routes (``Authorization: Bearer <settings.admin_token>``; errors in OpenAI's shape), as
:class:`rolloutd.trainer_client.admin.BackendAdmin` calls them::

    GET    /admin/backends            {"backends": [{name, type, url, policy_version, paused,
                                                     logprob_mode, num_assigned,
                                                     num_in_flight, ...}]}
    POST   /admin/backends            {url, type?, name?, policy_version?, logprob_mode?,
                                       return_routed_experts?, routed_experts_shape?}
                                       -> the backend
    DELETE /admin/backends/{name}     {"removed": [name]}
    DELETE /admin/backends            {"removed": [names]}      (clear)
    POST   /admin/backends/pause      {names?, drain_timeout_s?} -> {backends, paused,
                                                                    drained, num_in_flight}
    POST   /admin/backends/resume     {names?}
    POST   /admin/policy_version      {policy_version, names?} -> {backends, policy_version}
    POST   /admin/engine/load         {model_file, policy_version, timeout_s?} -> {model_file,
                                                          policy_version, duration_s}

``/admin/engine/load`` reloads the local engine that ``rolloutd up`` owns on a new GGUF (a path
on that machine) and answers once it serves it: the gateway forwards the call to the engine's
control server (:mod:`rolloutd.engine.control`, ``settings.engine_control_url``). It is the
push step of a weight sync (pause, load, policy_version, resume); it neither pauses nor stamps
a version itself. Without a local engine it answers 409; when the control server cannot be
reached, 503; the control server's own errors (400 no such file, 409 a lower version, 503
the engine did not come back) pass through with their status.

Authorization: a request without a bearer token gets 401; with no admin token configured the
routes are disabled and a request with one gets 403; a wrong token gets 401. A backend name
that is a URL (the default name is the URL) goes in the path as it is.
"""

from __future__ import annotations

import secrets
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rolloutd.errors import (
    AuthenticationError,
    BackendUnavailableError,
    ConflictError,
    PermissionDeniedError,
)
from rolloutd.http_client import CONTROL, new_async_client
from rolloutd.proxy.backends.specs import (
    BackendType,
    PoolName,
    RoutedExpertsShape,
    options_problem,
)
from rolloutd.proxy.dialects.common import validate
from rolloutd.proxy.http.gateway_parts import GatewayParts
from rolloutd.proxy.http.inbound import bearer_key, read_json
from rolloutd.types import LogprobMode


class AddBackend(BaseModel):
    """``POST /admin/backends``; the options are :class:`BackendSpec`'s."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048, pattern=r"^https?://\S+$")
    type: BackendType = "llama_cpp"
    name: str | None = Field(default=None, min_length=1, max_length=512)
    policy_version: int | None = Field(default=None, ge=0)
    pool: PoolName = Field(default="policy", description="``judge``: it serves judge sessions only")
    logprob_mode: LogprobMode | None = None
    return_routed_experts: bool = False
    routed_experts_shape: RoutedExpertsShape | None = None

    @model_validator(mode="after")
    def _options_fit_the_kind(self) -> AddBackend:
        if problem := options_problem(
            self.type, self.return_routed_experts, self.routed_experts_shape
        ):
            raise ValueError(problem)
        return self


class Names(BaseModel):
    """Backends an admin call applies to (all when ``names`` is omitted)."""

    model_config = ConfigDict(extra="forbid")

    names: list[str] | None = None


class Pause(Names):
    """``POST /admin/backends/pause``: ``drain_timeout_s`` bounds the wait for calls in
    flight (default ``settings.drain_timeout_s``)."""

    drain_timeout_s: float | None = Field(default=None, ge=0, le=3600)


class PolicyVersion(Names):
    """``POST /admin/policy_version``."""

    policy_version: int = Field(ge=0)


class LoadEngine(BaseModel):
    """``POST /admin/engine/load`` (the engine control server's body, forwarded as it is)."""

    model_config = ConfigDict(extra="forbid")

    model_file: str = Field(min_length=1, max_length=4096)
    policy_version: int = Field(ge=0)
    timeout_s: float = Field(default=120.0, gt=0, le=3600)


def authorize(request: Request, admin_token: str | None) -> None:
    """Check the admin bearer token.

    Raises:
        AuthenticationError: no bearer token, or a wrong one (401).
        PermissionDeniedError: no admin token is configured: admin routes are disabled (403).
    """
    sent = bearer_key(request)
    if sent is None:
        hint = (
            ""
            if admin_token
            else (
                "; this gateway has no admin token configured (ROLLOUTD_ADMIN_TOKEN), so admin "
                "routes are disabled"
            )
        )
        raise AuthenticationError(f"admin routes need `Authorization: Bearer <admin token>`{hint}")
    if not admin_token:
        raise PermissionDeniedError(
            "admin routes are disabled: this gateway has no admin "
            "token configured (set ROLLOUTD_ADMIN_TOKEN)"
        )
    if not secrets.compare_digest(sent.encode(), admin_token.encode()):
        raise AuthenticationError("invalid admin token")


def add_admin_routes(app: FastAPI, gateway: GatewayParts) -> None:
    """Register the ``/admin/...`` routes of ``gateway`` on ``app``."""
    settings = gateway.settings

    async def body_of(request: Request, model: type[Any]) -> Any:
        authorize(request, settings.admin_token)
        return validate(model, await read_json(request, settings.max_body_bytes, empty={}))

    @app.get("/admin/backends")
    async def list_backends(request: Request) -> dict[str, Any]:
        authorize(request, settings.admin_token)
        return {"backends": gateway.pool.describe()}

    @app.post("/admin/backends")
    async def add_backend(request: Request) -> dict[str, Any]:
        add: AddBackend = await body_of(request, AddBackend)
        return await gateway.pool.add(
            add.url,
            type=add.type,
            name=add.name,
            policy_version=add.policy_version,
            logprob_mode=add.logprob_mode,
            return_routed_experts=add.return_routed_experts,
            routed_experts_shape=add.routed_experts_shape,
            pool=add.pool,
        )

    @app.delete("/admin/backends")
    async def clear_backends(request: Request) -> dict[str, Any]:
        authorize(request, settings.admin_token)
        return {"removed": await gateway.pool.remove(None)}

    @app.delete("/admin/backends/{name:path}")
    async def remove_backend(name: str, request: Request) -> dict[str, Any]:
        authorize(request, settings.admin_token)
        return {"removed": await gateway.pool.remove([name])}

    @app.post("/admin/backends/pause")
    async def pause(request: Request) -> dict[str, Any]:
        body: Pause = await body_of(request, Pause)
        timeout_s = (
            settings.drain_timeout_s if body.drain_timeout_s is None else body.drain_timeout_s
        )
        return await gateway.pool.set_paused(True, body.names, drain_timeout_s=timeout_s)

    @app.post("/admin/backends/resume")
    async def resume(request: Request) -> dict[str, Any]:
        body: Names = await body_of(request, Names)
        return await gateway.pool.set_paused(False, body.names)

    @app.post("/admin/policy_version")
    async def policy_version(request: Request) -> dict[str, Any]:
        body: PolicyVersion = await body_of(request, PolicyVersion)
        names = await gateway.pool.set_policy_version(body.policy_version, body.names)
        return {"backends": names, "policy_version": body.policy_version}

    @app.post("/admin/engine/load")
    async def load_engine(request: Request) -> Any:
        body: LoadEngine = await body_of(request, LoadEngine)
        if not settings.engine_control_url:
            raise ConflictError(
                "this gateway has no local engine to reload: it was not "
                "started by `rolloutd up` with its own engine "
                "(ROLLOUTD_ENGINE_CONTROL_URL is unset); load weights through "
                "the backend's own API instead (vLLM, SGLang)"
            )
        url = settings.engine_control_url.rstrip("/") + "/engine/load"
        headers = {"Authorization": f"Bearer {settings.engine_control_token or ''}"}
        try:
            async with new_async_client(CONTROL, timeout_s=body.timeout_s + 30.0) as http:
                answer = await http.post(url, json=body.model_dump(), headers=headers)
        except httpx.HTTPError as e:
            raise BackendUnavailableError(
                f"the engine control server at {url} did not answer: {e!r}"
            ) from e
        try:
            content = answer.json()
        except ValueError:
            content = {"error": {"message": answer.text[:500], "type": "engine_control"}}
        return JSONResponse(content, status_code=answer.status_code)
