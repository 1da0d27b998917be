"""One factory for every httpx client rolloutd makes, with named timeout profiles.

Every HTTP client of rolloutd (the gateway's backends and their health probes, the gateway's
engine control, the sandbox's verdict polls, the trainer client's admin, weight-sync and
fleet-health calls, the eval fleet's callbacks, the trace viewer) is built by
:func:`new_async_client` with one of the :class:`TimeoutProfile` s below, so how long each kind
of call waits is written in one place. Clients never retry: Temporal owns retries, and a
retried sampling call could sample twice.

A profile's ``timeout_s`` bounds each phase of a request as httpx counts them (connect, each
read, each write, and the wait for a pooled connection; httpx "Timeouts"), with connecting
capped at ``connect_s`` where a profile sets it. A caller whose call has its own budget (a
weight load, a drain) passes it as ``timeout_s``.

The backend call path keeps its own transport (httpx-aiohttp, in
:mod:`rolloutd.proxy.backends.http`) and client class; this factory only sets what every
client shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

C = TypeVar("C", bound=httpx.AsyncClient)


@dataclass(frozen=True)
class TimeoutProfile:
    """How long one kind of call waits.

    Attributes:
        name: what the calls are (``backend_call``, ``health_probe``, ...).
        timeout_s: the bound of each phase (connect, read, write, pool), seconds (> 0).
        connect_s: a lower bound for connecting, seconds, or None (``timeout_s``).
    """

    name: str
    timeout_s: float
    connect_s: float | None = None

    def timeout(self, timeout_s: float | None = None) -> httpx.Timeout:
        """The httpx timeout of this profile, with ``timeout_s`` instead of the profile's
        own when given (connecting still capped at ``connect_s``).

        Args:
            timeout_s: the call's own budget, seconds (> 0), or None.
        """
        bound = self.timeout_s if timeout_s is None else timeout_s
        connect = bound if self.connect_s is None else min(bound, self.connect_s)
        return httpx.Timeout(bound, connect=connect)


#: a sampling call to a backend: the answer of a non-streamed call comes at its end, so the
#: backend's longest generation must fit (``settings.backend_timeout_s`` is passed); a new
#: connection opens within 10 s, or the backend counts as unreachable
BACKEND_CALL = TimeoutProfile("backend_call", 600.0, connect_s=10.0)
#: a liveness question (a backend's ``/health``, the gateway's ``/health`` or a session's
#: verdict): a server that does not answer in 5 s is not answering (httpx's own default)
HEALTH_PROBE = TimeoutProfile("health_probe", 5.0)
#: an operator's call to a rolloutd service that waits for work behind it (the admin API,
#: whose pause waits for a drain; a weight load; the engine's control server; the viewer's
#: first page); callers pass the call's own budget when it has one
CONTROL = TimeoutProfile("control", 120.0)
#: a session's result POSTed to a task's ``callback_url``
CALLBACK = TimeoutProfile("callback", 30.0)

#: every profile by name
PROFILES = {p.name: p for p in (BACKEND_CALL, HEALTH_PROBE, CONTROL, CALLBACK)}


def new_async_client(
    profile: TimeoutProfile,
    *,
    timeout_s: float | None = None,
    base_url: str = "",
    headers: dict[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    client_class: type[C] = httpx.AsyncClient,  # type: ignore[assignment]
    **options: Any,
) -> C:
    """An httpx client with ``profile``'s timeouts; redirects are not followed, nothing is
    retried.

    Args:
        profile: the kind of call (:data:`BACKEND_CALL`, :data:`HEALTH_PROBE`,
            :data:`CONTROL`, :data:`CALLBACK`).
        timeout_s: the call's own budget instead of the profile's, seconds (> 0), or None.
        base_url: prepended to relative request URLs.
        headers: sent with every request.
        transport: the transport (tests put ``httpx.ASGITransport`` or
            ``httpx.MockTransport`` here; the backends their aiohttp one), or None for
            httpx's own.
        client_class: ``httpx.AsyncClient`` or a subclass (the backends' JSON writer).
        options: further keyword arguments of ``client_class``.
    """
    return client_class(
        base_url=base_url,
        headers=headers,
        timeout=profile.timeout(timeout_s),
        follow_redirects=False,
        transport=transport,
        **options,
    )
