"""Weight sync: the trainer's new weights reach the inference servers between two calls.

The protocol (ProRL Agent's pause / update / resume cycle, over the gateway's admin API)::

    sync = WeightSync(admin, [GatewayEngineLoader(admin)])  # or EngineLoader(engine),
                                                            # VllmLoader(url), SglangLoader(url)
    await sync.update(export_gguf(model.state_dict(), template, path), policy_version=step)

which is three steps a trainer may also take one by one:

1. :meth:`WeightSync.begin`: ``POST /admin/backends/pause``. New calls wait at the gateway; the
   calls in flight finish (drain). Raises when the drain did not finish in time, since a
   reload would cut those calls off.
2. :meth:`WeightSync.push`: every loader makes its server serve the new weights and returns
   once it answers: the local engine restarts llama-server on the new GGUF (the one control
   interface "load this GGUF, answer when ready", :class:`EngineControl`; in this process with
   :class:`EngineLoader`, or in ``rolloutd up``'s process through the gateway's
   ``POST /admin/engine/load`` with :class:`GatewayEngineLoader`); vLLM and SGLang
   load a checkpoint folder through their own weight-update endpoints.
3. :meth:`WeightSync.end`: ``POST /admin/policy_version`` then ``POST /admin/backends/resume``.
   Every completion sampled after it carries the new ``policy_version``; the waiting calls go on.

Sessions keep their token chains across a reload: in ``tokens`` mode the gateway sends the whole
prompt as token ids on every call, so a restarted engine sees exactly the chain it would have
seen; each completion records the ``policy_version`` that sampled it, so a trajectory says which
of its turns came from which weights.

When a push fails the backends stay paused and the error is raised: an engine in an unknown
state must not answer calls stamped with either version. The trainer retries :meth:`push`, or
calls :meth:`abort` to resume on the old version.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx
import structlog

from rolloutd.errors import RolloutdError
from rolloutd.http_client import CONTROL, new_async_client
from rolloutd.trainer_client.admin import BackendAdmin

log = structlog.get_logger(__name__)


class WeightSyncError(RolloutdError):
    """A weight update did not complete: the drain timed out, or a server refused the weights.

    ``retryable`` is True: the backends stay paused and the same update may be pushed again.
    """

    retryable = True


class EngineControl(Protocol):
    """The reference engine's one control interface: "load this GGUF, answer when ready".

    Honoured by :meth:`rolloutd.stack.local.LocalStack.load_model` (``rolloutd up``: the
    supervisor then owns the file and version and restarts a crashed engine on them) and
    :meth:`rolloutd.engine.server.LlamaServer.load_model` (a standalone engine).
    """

    def load_model(self, model_file: Path, policy_version: int, timeout_s: float = 120.0) -> None:
        """Serve ``model_file`` as ``policy_version``; return once the engine answers."""


class WeightLoader(Protocol):
    """Makes one inference server serve new weights."""

    async def load(self, path: Path, policy_version: int) -> None:
        """Load the weights at ``path``; return once the server answers with them.

        Raises:
            WeightSyncError: the server refused them.
        """


class EngineLoader:
    """The reference engine (llama-server) loads a GGUF through its :class:`EngineControl`.

    Args:
        control: the engine's owner (``LocalStack`` or ``LlamaServer``).
        timeout_s: bound on the reload (stop, start, first ``/health`` 200), s.
    """

    def __init__(self, control: EngineControl, *, timeout_s: float = 120.0) -> None:
        self.control = control
        self.timeout_s = timeout_s

    async def load(self, path: Path, policy_version: int) -> None:
        """Restart the engine on ``path`` (a GGUF) and wait until it answers.

        Raises:
            WeightSyncError: the engine did not come back within ``timeout_s``.
        """
        try:
            await asyncio.to_thread(
                self.control.load_model, Path(path), policy_version, self.timeout_s
            )
        except RolloutdError as e:
            raise WeightSyncError(f"the engine did not load {path}: {e}") from e


class GatewayEngineLoader:
    """The local engine of ``rolloutd up`` (another process) loads a GGUF, asked through the
    gateway's admin route ``POST /admin/engine/load`` (forwarded to the engine's control
    server, :mod:`rolloutd.engine.control`).

    The GGUF path must be readable on the engine's machine (``up`` runs the gateway and the
    engine on one machine).

    Args:
        admin: the gateway's admin client (its token).
        timeout_s: bound on the reload (stop, start, first ``/health`` 200), s.
    """

    def __init__(self, admin: BackendAdmin, *, timeout_s: float = 120.0) -> None:
        self.admin = admin
        self.timeout_s = timeout_s

    async def load(self, path: Path, policy_version: int) -> None:
        """Reload the engine on ``path`` and wait until it answers.

        Raises:
            WeightSyncError: the gateway or the engine refused (no local engine, no such file,
                a lower version) or the engine did not come back within ``timeout_s``.
        """
        try:
            await self.admin.load_engine(
                str(Path(path).resolve()), policy_version, timeout_s=self.timeout_s
            )
        except (RolloutdError, httpx.HTTPError) as e:
            raise WeightSyncError(f"the engine did not load {path}: {e}") from e


class _HttpLoader:
    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.http = new_async_client(
            CONTROL, timeout_s=timeout_s, base_url=self.url, headers=headers, transport=transport
        )

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.http.aclose()

    async def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = await self.http.post(path, json=body)
        except httpx.HTTPError as e:
            raise WeightSyncError(f"POST {self.url}{path}: {e!r}") from e
        if response.status_code >= 300:
            raise WeightSyncError(
                f"POST {self.url}{path}: {response.status_code} {response.text[:500]}"
            )
        # SGLang's /flush_cache answers plain text; the answers that matter are JSON
        if "json" not in response.headers.get("content-type", ""):
            return response.text
        return response.json()


class SglangLoader(_HttpLoader):
    """SGLang loads a checkpoint folder in place: ``POST /update_weights_from_disk``.

    Shapes (SGLang "Native APIs", ``update_weights_from_disk``): body
    ``{"model_path": str, "load_format": str?, "weight_version": str?}``; answer
    ``{"success": bool, "message": str, ...}``, HTTP 200 on success and 400 on failure. Then
    ``POST /flush_cache`` drops the radix cache, whose entries were computed with the old weights.

    Args:
        url: the SGLang server's base URL.
        load_format: SGLang's ``load_format`` (None: its default).
    """

    def __init__(self, url: str, *, load_format: str | None = None, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.load_format = load_format

    async def load(self, path: Path, policy_version: int) -> None:
        """Load the folder ``path`` (Hugging Face format) as ``policy_version``.

        Raises:
            WeightSyncError: SGLang answered ``success: false`` or an HTTP error.
        """
        body: dict[str, Any] = {"model_path": str(path), "weight_version": str(policy_version)}
        if self.load_format is not None:
            body["load_format"] = self.load_format
        answer = await self._post("/update_weights_from_disk", body)
        if not (isinstance(answer, dict) and answer.get("success")):
            raise WeightSyncError(f"SGLang did not load {path}: {answer}")
        await self._post("/flush_cache")


class VllmLoader(_HttpLoader):
    """vLLM reloads weights from a checkpoint folder through its development endpoints.

    Shapes (vLLM's server in ``VLLM_SERVER_DEV_MODE=1``: ``POST /collective_rpc`` with
    ``{"method": str, "args": [...], "kwargs": {...}, "timeout": float?}``, answered
    ``{"results": [one per worker]}``; ``POST /reset_prefix_cache``): the workers'
    ``update_config`` points the model config at the new folder, ``reload_weights`` loads it in
    place (no restart, no new KV cache), and the prefix cache built from the old weights is
    dropped.

    Args:
        url: the vLLM server's base URL.
        rpc_timeout_s: bound vLLM puts on each collective call, s.
    """

    def __init__(self, url: str, *, rpc_timeout_s: float = 600.0, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.rpc_timeout_s = rpc_timeout_s

    async def _rpc(self, method: str, *args: Any) -> Any:
        return await self._post(
            "/collective_rpc",
            {"method": method, "args": list(args), "kwargs": {}, "timeout": self.rpc_timeout_s},
        )

    async def load(self, path: Path, policy_version: int) -> None:
        """Reload the weights from the folder ``path`` (Hugging Face format).

        Raises:
            WeightSyncError: vLLM answered an HTTP error (404: dev mode is off).
        """
        await self._rpc("update_config", {"model_config": {"model": str(path)}})
        await self._rpc("reload_weights")
        await self._post("/reset_prefix_cache")


class WeightSync:
    """The trainer's side of a weight update: pause, push, stamp, resume.

    Args:
        admin: the gateway's admin client (its token).
        loaders: one per inference server behind the gateway.
        names: backend names the update applies to (None: all).
        drain_timeout_s: bound on the wait for calls in flight (None: the gateway's default).
    """

    def __init__(
        self,
        admin: BackendAdmin,
        loaders: Sequence[WeightLoader],
        *,
        names: list[str] | None = None,
        drain_timeout_s: float | None = None,
    ) -> None:
        self.admin = admin
        self.loaders = list(loaders)
        self.names = names
        self.drain_timeout_s = drain_timeout_s

    async def begin(self) -> dict[str, Any]:
        """Pause the backends: new calls wait, calls in flight finish.

        Returns:
            The gateway's answer: ``{backends, paused, drained, num_in_flight}``.

        Raises:
            WeightSyncError: calls were still in flight at the drain timeout (the backends
                stay paused; call :meth:`abort` or :meth:`begin` again).
        """
        answer = await self.admin.pause(self.names, drain_timeout_s=self.drain_timeout_s)
        if not answer.get("drained", False):
            raise WeightSyncError(
                f"{answer.get('num_in_flight')} calls still in flight after "
                f"the drain timeout; the backends stay paused"
            )
        return answer

    async def push(self, path: str | Path, policy_version: int) -> float:
        """Every loader loads the weights at ``path``, all at once.

        Returns:
            Wall time of the slowest load, s.

        Raises:
            WeightSyncError: a server did not load them (the backends stay paused).
        """
        t0 = time.monotonic()
        await asyncio.gather(*(loader.load(Path(path), policy_version) for loader in self.loaders))
        duration_s = time.monotonic() - t0
        log.info(
            "weights_pushed",
            path=str(path),
            policy_version=policy_version,
            num_servers=len(self.loaders),
            duration_s=round(duration_s, 2),
        )
        return duration_s

    async def end(self, policy_version: int) -> None:
        """Stamp ``policy_version`` on every later completion, then resume the backends."""
        await self.admin.set_policy_version(policy_version, self.names)
        await self.admin.resume(self.names)

    async def abort(self) -> None:
        """Resume the backends without a new version (after a failed push)."""
        await self.admin.resume(self.names)

    async def update(self, path: str | Path, policy_version: int) -> float:
        """:meth:`begin`, :meth:`push` and :meth:`end` in one call.

        Returns:
            Wall time of the whole update, pause to resume, s.

        Raises:
            WeightSyncError: the drain or a load failed (the backends stay paused).
        """
        t0 = time.monotonic()
        await self.begin()
        await self.push(path, policy_version)
        await self.end(policy_version)
        duration_s = time.monotonic() - t0
        log.info("weights_synced", policy_version=policy_version, duration_s=round(duration_s, 2))
        return duration_s
