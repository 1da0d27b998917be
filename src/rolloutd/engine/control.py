"""The engine's control interface over HTTP, for processes that do not own the engine.

``rolloutd up`` owns llama-server (its supervisor restarts a crashed engine on the current file and
version: docs/decisions.md, "One engine control interface"), while the gateway runs in another
process and a trainer in a third. :class:`EngineControlServer` puts the one control interface, "load
this GGUF, answer when ready" (``load_model(model_file, policy_version, timeout_s)``, honoured by
``LocalStack`` and ``LlamaServer``), on a loopback HTTP port; the gateway's admin route ``POST
/admin/engine/load`` forwards to it, so a trainer anywhere reaches it with the gateway's admin token
(:class:`rolloutd.trainer_client.training.weight_sync.GatewayEngineLoader`).

Routes (``Authorization: Bearer <control token>``; the token is the owner's, handed to the
gateway in ``ROLLOUTD_ENGINE_CONTROL_TOKEN``, never the admin token)::

    GET  /engine          {"model_file": str, "policy_version": int}
    POST /engine/load     {"model_file": str, "policy_version": int, "timeout_s"?: float}
                          -> {"model_file", "policy_version", "duration_s"}

Errors: ``{"error": {"message", "type"}}`` with 401 (no or wrong token), 400 (no such file, bad
field; 422 when the body is not a JSON object), 409 (a version lower than the one served), 503 (the
engine did not answer in time; the
owner restarts it on the file it had). Loads are serialized: one at a time.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import structlog
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rolloutd.errors import (
    AuthenticationError,
    ConflictError,
    InvalidRequestError,
    RolloutdError,
)

log = structlog.get_logger(__name__)


class ModelLoader(Protocol):
    """What owns an engine: ``load_model`` and the version it serves."""

    policy_version: int

    def load_model(self, model_file: Path, policy_version: int, timeout_s: float = 120.0) -> None:
        """Serve ``model_file`` as ``policy_version``; return once the engine answers."""


class LoadModel(BaseModel):
    """``POST /engine/load``."""

    model_config = ConfigDict(extra="forbid")

    model_file: str = Field(
        min_length=1, max_length=4096, description="absolute path of a GGUF on the engine's machine"
    )
    policy_version: int = Field(ge=0)
    timeout_s: float = Field(
        default=120.0, gt=0, le=3600, description="bound on restart and first /health 200, s"
    )


class _Quiet(uvicorn.Server):
    """uvicorn without signal handlers: the owning process keeps its own."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _error(error: RolloutdError) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": error.message, "type": error.error_type}},
        status_code=error.status_code,
    )


class EngineControlServer:
    """Serves ``owner.load_model`` on ``http://{host}:{port}`` from a background thread.

    Args:
        owner: the engine's owner (``LocalStack`` or ``LlamaServer``).
        token: bearer token callers must send (default: a new random one).
        host: bind address (loopback: the gateway runs on the same machine).
        port: bind port, 0 for any.

    Use :meth:`start` / :meth:`stop`, or as a context manager.
    """

    def __init__(
        self,
        owner: ModelLoader,
        *,
        token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.owner = owner
        self.token = token or secrets.token_urlsafe(24)
        self.host = host
        self.port = port
        self.model_file: str | None = None
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = self._make_app()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123``."""
        return f"http://{self.host}:{self.port}"

    def _authorize(self, request: Request) -> None:
        header = request.headers.get("authorization", "")
        sent = header[7:] if header.lower().startswith("bearer ") else None
        if sent is None or not secrets.compare_digest(sent.encode(), self.token.encode()):
            raise AuthenticationError(
                "engine control needs `Authorization: Bearer <control "
                "token>` (ROLLOUTD_ENGINE_CONTROL_TOKEN)"
            )

    def load(self, body: LoadModel) -> dict[str, Any]:
        """Load ``body.model_file`` through the owner; one load at a time.

        Raises:
            InvalidRequestError: the file does not exist (400).
            ConflictError: ``policy_version`` is lower than the one served (409).
            RolloutdError: the engine did not answer in time (the owner's error; 503 here).
        """
        path = Path(body.model_file)
        if not path.is_file():
            raise InvalidRequestError(
                f"model_file {body.model_file!r} is not a file on the engine's machine"
            )
        with self._lock:
            current = self.owner.policy_version
            if body.policy_version < current:
                raise ConflictError(
                    f"policy_version {body.policy_version} is lower than the "
                    f"version served ({current})"
                )
            t0 = time.monotonic()
            self.owner.load_model(path, body.policy_version, body.timeout_s)
            self.model_file = str(path)
        duration_s = time.monotonic() - t0
        log.info(
            "engine_control_loaded",
            model_file=str(path),
            policy_version=body.policy_version,
            duration_s=round(duration_s, 2),
        )
        return {
            "model_file": str(path),
            "policy_version": body.policy_version,
            "duration_s": duration_s,
        }

    def _make_app(self) -> FastAPI:
        app = FastAPI(
            title="rolloutd engine control", docs_url=None, redoc_url=None, openapi_url=None
        )

        @app.exception_handler(RolloutdError)
        async def _rolloutd_error(request: Request, error: RolloutdError) -> JSONResponse:
            if type(error).status_code == 500:  # the owner's failure to bring the engine up
                return JSONResponse(
                    {"error": {"message": error.message, "type": "engine_unavailable"}},
                    status_code=503,
                )
            return _error(error)

        @app.get("/engine")
        def state(request: Request) -> dict[str, Any]:
            self._authorize(request)
            return {"model_file": self.model_file, "policy_version": self.owner.policy_version}

        @app.post("/engine/load")
        def load(request: Request, raw: dict[str, Any]) -> dict[str, Any]:
            self._authorize(request)
            try:
                body = LoadModel.model_validate(raw)
            except ValidationError as e:
                raise InvalidRequestError(f"invalid body: {e.errors(include_url=False)}") from e
            return self.load(body)

        return app

    def start(self, timeout_s: float = 30.0) -> EngineControlServer:
        """Bind the port and serve from a daemon thread; return once it accepts.

        Raises:
            OSError: the port is taken.
            RolloutdError: uvicorn did not start within ``timeout_s``.
        """
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._server = _Quiet(
            uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="engine-control", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RolloutdError(f"engine control server did not start on {self.url}")
            time.sleep(0.05)
        log.info("engine_control_started", url=self.url)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving (a load in progress finishes first, up to ``timeout_s``)."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout_s)
        self._server = self._thread = None

    def __enter__(self) -> EngineControlServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
