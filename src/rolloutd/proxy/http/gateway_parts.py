"""What the routes use of the gateway: its settings, backend pool, sessions and call service.

:class:`rolloutd.proxy.http.server.Gateway` has these parts; the routes name them through
:class:`GatewayParts`, a structural type, so the app and its routers do not import the server
that builds them.
"""

from __future__ import annotations

from typing import Protocol

from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.calls.service import ChatService
from rolloutd.proxy.sessions.manager import SessionManager
from rolloutd.settings import GatewaySettings


class GatewayParts(Protocol):
    """The parts of a gateway its routes use.

    Attributes:
        settings: the gateway's settings (body and header limits, admin token, timeouts).
        pool: the backends.
        sessions: open, close and look up sessions.
        service: the call service (one model call from request to recorded answer).
    """

    settings: GatewaySettings
    pool: BackendPool
    sessions: SessionManager
    service: ChatService
