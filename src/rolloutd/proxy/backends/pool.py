"""The backend pool: which backends serve, and which session is pinned to which.

A session stays on one backend for prefix-cache reuse; a new session goes to the
least-assigned backend (DESIGN.md, Gateway). This pool lives in process memory and is built
from settings; the durable pool (add, remove, pause and drain for weight sync) will keep the
same interface.
"""

from __future__ import annotations

from collections.abc import Iterable

import httpx
import structlog

from rolloutd.errors import BackendUnavailableError, ConfigError
from rolloutd.proxy.backends.base import Backend
from rolloutd.proxy.backends.llama_cpp import LlamaCppBackend
from rolloutd.proxy.backends.openai_compat import OpenAIChatBackend
from rolloutd.proxy.backends.sglang import SglangBackend
from rolloutd.proxy.backends.vllm import VllmBackend
from rolloutd.settings import GatewaySettings

log = structlog.get_logger(__name__)


def backend_urls(setting: str | None) -> list[str]:
    """Backend URLs from ``settings.backend_url``: one URL, or several separated by commas."""
    if not setting:
        return []
    return [url.strip().rstrip("/") for url in setting.split(",") if url.strip()]


def make_backend(backend_type: str, name: str, url: str, *, policy_version: int = 0,
                 timeout_s: float = 600.0, ctx_size: int | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> Backend:
    """A backend client of ``backend_type`` (``llama_cpp``, ``vllm``, ``sglang``, ``openai``).

    Raises:
        ConfigError: an unknown type.
    """
    kinds: dict[str, type[Backend]] = {"llama_cpp": LlamaCppBackend, "vllm": VllmBackend,
                                       "sglang": SglangBackend, "openai": OpenAIChatBackend}
    if backend_type not in kinds:
        raise ConfigError(f"unknown backend type {backend_type!r}; known: {', '.join(kinds)}")
    return kinds[backend_type](name, url, policy_version=policy_version,  # type: ignore[call-arg]
                               timeout_s=timeout_s, ctx_size=ctx_size, transport=transport)


class BackendPool:
    """The backends of this gateway and how many sessions each is assigned.

    Args:
        backends: the backends; names must be unique.

    Raises:
        ConfigError: two backends share a name.
    """

    def __init__(self, backends: Iterable[Backend] = ()) -> None:
        self._backends: dict[str, Backend] = {}
        self._num_assigned: dict[str, int] = {}
        for backend in backends:
            self.add(backend)

    @classmethod
    def from_settings(cls, settings: GatewaySettings, *,
                      transport: httpx.AsyncBaseTransport | None = None,
                      ctx_size: int | None = None) -> BackendPool:
        """One backend per URL of ``settings.backend_url``, policy version 0, named by URL.

        Args:
            settings: the gateway settings (``backend_url``, ``backend_type``,
                ``backend_timeout_s``).
            transport: httpx transport for every backend client (tests).
            ctx_size: context window per sequence; None asks each backend.

        Raises:
            ConfigError: an unknown backend type.
        """
        return cls(make_backend(settings.backend_type, url, url,
                                timeout_s=settings.backend_timeout_s, ctx_size=ctx_size,
                                transport=transport)
                   for url in backend_urls(settings.backend_url))

    def add(self, backend: Backend) -> None:
        """Register ``backend``.

        Raises:
            ConfigError: a backend of that name exists.
        """
        if backend.name in self._backends:
            raise ConfigError(f"backend {backend.name!r} is registered already")
        self._backends[backend.name] = backend
        self._num_assigned[backend.name] = 0
        log.info("backend_added", **backend.describe())

    def names(self) -> list[str]:
        """Names of the registered backends."""
        return list(self._backends)

    def get(self, name: str) -> Backend:
        """The backend named ``name``.

        Raises:
            BackendUnavailableError: it is not registered (any more).
        """
        try:
            return self._backends[name]
        except KeyError:
            raise BackendUnavailableError(f"backend {name!r} is not registered") from None

    def assign(self) -> Backend:
        """Pin a new session to the least-assigned backend (first registered on ties).

        Raises:
            BackendUnavailableError: no backend is registered.
        """
        if not self._backends:
            raise BackendUnavailableError("no backend is registered")
        name = min(self._backends, key=lambda n: self._num_assigned[n])
        self._num_assigned[name] += 1
        return self._backends[name]

    def note_assigned(self, name: str) -> None:
        """Count a session pinned to ``name`` earlier (loaded from the store)."""
        if name in self._num_assigned:
            self._num_assigned[name] += 1

    def release(self, name: str) -> None:
        """A session pinned to ``name`` was closed."""
        if self._num_assigned.get(name, 0) > 0:
            self._num_assigned[name] -= 1

    def num_assigned(self, name: str) -> int:
        """Open sessions pinned to ``name``."""
        return self._num_assigned.get(name, 0)

    async def aclose(self) -> None:
        """Close every backend client."""
        for backend in self._backends.values():
            await backend.aclose()
