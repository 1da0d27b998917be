"""The gateway's admin routes: the durable backend pool (transport only; logic in the pool).

Routes (``Authorization: Bearer <settings.admin_token>``; errors in OpenAI's shape), as
:class:`rolloutd.trainer_client.admin.BackendAdmin` calls them::

    GET    /admin/backends            {"backends": [{name, type, url, policy_version, paused,
                                                     num_assigned, num_in_flight}]}
    POST   /admin/backends            {url, type?, name?, policy_version?} -> the backend
    DELETE /admin/backends/{name}     {"removed": [name]}
    DELETE /admin/backends            {"removed": [names]}      (clear)
    POST   /admin/backends/pause      {names?, drain_timeout_s?} -> {backends, paused,
                                                                    drained, num_in_flight}
    POST   /admin/backends/resume     {names?}
    POST   /admin/policy_version      {policy_version, names?} -> {backends, policy_version}

Authorization: a request without a bearer token gets 401; with no admin token configured the
routes are disabled and a request with one gets 403; a wrong token gets 401. A backend name
that is a URL (the default name is the URL) goes in the path as it is.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from rolloutd.errors import AuthenticationError, PermissionDeniedError
from rolloutd.proxy.backends.pool import BackendType
from rolloutd.proxy.dialects.common import validate
from rolloutd.proxy.inbound import bearer_key, read_json

if TYPE_CHECKING:
    from rolloutd.proxy.gateway import Gateway


class AddBackend(BaseModel):
    """``POST /admin/backends``."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048, pattern=r"^https?://\S+$")
    type: BackendType = "llama_cpp"
    name: str | None = Field(default=None, min_length=1, max_length=512)
    policy_version: int | None = Field(default=None, ge=0)


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


def authorize(request: Request, admin_token: str | None) -> None:
    """Check the admin bearer token.

    Raises:
        AuthenticationError: no bearer token, or a wrong one (401).
        PermissionDeniedError: no admin token is configured: admin routes are disabled (403).
    """
    sent = bearer_key(request)
    if sent is None:
        hint = "" if admin_token else (
            "; this gateway has no admin token configured (ROLLOUTD_ADMIN_TOKEN), so admin "
            "routes are disabled")
        raise AuthenticationError(f"admin routes need `Authorization: Bearer <admin token>`{hint}")
    if not admin_token:
        raise PermissionDeniedError("admin routes are disabled: this gateway has no admin "
                                    "token configured (set ROLLOUTD_ADMIN_TOKEN)")
    if not secrets.compare_digest(sent.encode(), admin_token.encode()):
        raise AuthenticationError("invalid admin token")


def add_admin_routes(app: FastAPI, gateway: Gateway) -> None:
    """Register the ``/admin/...`` routes of ``gateway`` on ``app``."""
    settings = gateway.settings

    async def body_of(request: Request, model: type[Any]) -> Any:
        authorize(request, settings.admin_token)
        return validate(model, await read_json(request, settings.max_body_bytes,
                                               empty={}))

    @app.get("/admin/backends")
    async def list_backends(request: Request) -> dict[str, Any]:
        authorize(request, settings.admin_token)
        return {"backends": gateway.pool.describe()}

    @app.post("/admin/backends")
    async def add_backend(request: Request) -> dict[str, Any]:
        add: AddBackend = await body_of(request, AddBackend)
        return await gateway.pool.add(add.url, type=add.type, name=add.name,
                                      policy_version=add.policy_version)

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
        timeout_s = settings.drain_timeout_s if body.drain_timeout_s is None \
            else body.drain_timeout_s
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
