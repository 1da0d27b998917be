"""What every HTTP backend shares: one httpx client per backend over aiohttp's connections,
without retries; status and transport mapping; an SSE line reader.

Every backend call (the model call's POST, streams, GETs; ``http://`` or ``https://``) goes
through the client :func:`new_client` builds: httpx is the interface (tests put an httpx
transport in its place), and underneath the connections are aiohttp's (``httpx-aiohttp``, the
transport the OpenAI and Anthropic Python SDKs offer). rolloutd speaks no HTTP of its own.

Temporal owns retries (docs/failures.md): a retried sampling call here could sample twice. The one
request sent again is one whose pooled connection the backend closed before answering a byte
of it (RFC 9112 section 9.3.1, "Retrying Requests": a connection closed while idle, a race
every keep-alive client meets); a request on a new connection is never sent twice.

Failures are raised as the httpx errors httpcore raises for the same failures (a refused
connection ``ConnectError``, a pooled connection not had in time ``ConnectTimeout``, no byte
within the read timeout ``ReadTimeout``, an answer dropped or malformed
``RemoteProtocolError``), so :func:`transport_error` maps each to the error tree once.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import structlog
from httpx_aiohttp import AiohttpTransport

from rolloutd.errors import BackendError, BackendUnavailableError, ContextLengthError
from rolloutd.fault import status_fault, transport_fault
from rolloutd.http_client import BACKEND_CALL, new_async_client
from rolloutd.proxy.backends.base import Backend
from rolloutd.proxy.core import fastjson
from rolloutd.types import LogprobMode

log = structlog.get_logger(__name__)

_CONTEXT_HINTS = (
    "maximum context length",
    "context length",
    "exceed_context_size",
    "longer than the model",
    # llama-server's message ("request (13954 tokens) exceeds the available context size
    # (4096 tokens)"); its type, exceed_context_size_error, is not in the message
    "exceeds the available context size",
)

#: connections open at once to one backend; further calls wait for a free one
MAX_CONNECTIONS = 128
#: seconds to open a TCP (and TLS) connection, at most (the backend-call timeout profile)
CONNECT_TIMEOUT_S = BACKEND_CALL.connect_s
#: seconds an idle pooled connection is kept: below the backends' own idle timeout (uvicorn's
#: ``timeout_keep_alive``, 5 s, which vLLM and SGLang serve with; cpp-httplib's keep-alive in
#: llama-server, 5 s), so a connection the backend closes while idle is not picked for a call
KEEPALIVE_EXPIRY_S = 4.0


@dataclass
class _Sending:
    """The attempt being sent in this task: whether its connection came from the pool."""

    reused: bool = False


#: set by :meth:`BackendTransport.handle_async_request`, filled by :class:`_Connector`
#: (aiohttp acquires the connection in the caller's task)
_SENDING: ContextVar[_Sending | None] = ContextVar("rolloutd_backend_sending", default=None)


class _Connector(aiohttp.TCPConnector):
    """aiohttp's connection pool, telling the attempt being sent whether its connection was
    used before (a new connection's drop must not send the request again)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._used: weakref.WeakSet[Any] = weakref.WeakSet()

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        """aiohttp's ``connect``; notes reuse on the current :class:`_Sending`."""
        connection = await super().connect(req, traces, timeout)
        sending = _SENDING.get()
        if sending is not None:
            protocol = connection.protocol
            sending.reused = protocol in self._used
            self._used.add(protocol)
        return connection


def _httpx_error(error: BaseException, request: httpx.Request) -> httpx.TransportError:
    """The httpx error httpcore raises for the failure aiohttp raised as ``error``.

    httpx-aiohttp's own table maps a dropped connection (``ServerDisconnectedError``, a
    ``ClientConnectionError``) to ``ConnectTimeout``, which would report a backend that was
    reached as unreachable; this one follows httpcore.
    """
    if isinstance(error, httpx.TransportError) and not isinstance(
        error.__cause__, aiohttp.ClientError | asyncio.TimeoutError
    ):
        return error
    cause = error.__cause__ if isinstance(error, httpx.TransportError) else error
    message = str(cause) or type(cause).__name__
    if isinstance(cause, aiohttp.ConnectionTimeoutError):  # connect, or wait for the pool
        return httpx.ConnectTimeout(message, request=request)
    if isinstance(cause, aiohttp.SocketTimeoutError):  # no byte within the read timeout
        return httpx.ReadTimeout(message, request=request)
    if isinstance(cause, asyncio.TimeoutError):
        return httpx.TimeoutException(message, request=request)
    if isinstance(cause, aiohttp.ClientConnectorError):  # refused, unresolvable
        return httpx.ConnectError(message, request=request)
    if isinstance(cause, aiohttp.ClientOSError):  # reset, broken pipe
        return httpx.ReadError(message, request=request)
    # dropped (ServerDisconnectedError), cut short (ClientPayloadError), not HTTP at all
    return httpx.RemoteProtocolError(f"{type(cause).__name__}: {message}", request=request)


def _unanswered(error: BaseException) -> bool:
    """Whether ``error`` (raised before the answer's head was read) says the connection ended
    with no byte of the answer: closed (``ServerDisconnectedError`` with no partial answer) or
    reset (``ClientOSError``; aiohttp's ``ClientConnectionResetError``, a writing to a closed
    transport, is a ``ConnectionResetError``), not a connect failure."""
    cause = error.__cause__ if isinstance(error, httpx.TransportError) else error
    if isinstance(cause, aiohttp.ServerDisconnectedError):
        return isinstance(cause.message, str)  # else the part of an answer that came
    return isinstance(cause, aiohttp.ClientOSError | ConnectionResetError) and not isinstance(
        cause, aiohttp.ClientConnectorError
    )


class _Body(httpx.AsyncByteStream):
    """An answer's body as httpx-aiohttp streams it, its failures mapped by
    :func:`_httpx_error`."""

    def __init__(self, stream: httpx.AsyncByteStream, request: httpx.Request) -> None:
        self._stream = stream
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
                yield chunk
        except (httpx.TransportError, aiohttp.ClientError) as e:
            raise _httpx_error(e, self._request) from (e.__cause__ or e)

    async def aclose(self) -> None:
        await self._stream.aclose()


_SEND_ERRORS = (httpx.TransportError, aiohttp.ClientError, asyncio.TimeoutError)


class BackendTransport(AiohttpTransport):
    """httpx-aiohttp's transport over one aiohttp connection pool, with aiohttp's failures
    raised as the httpx errors httpcore raises for them (see the module docstring), and a
    request that a pooled connection lost before any byte of its answer sent once more.

    Args:
        max_connections: connections open at once (>= 1); further calls wait for a free one
            within the pool timeout.
        keepalive_expiry_s: seconds an idle connection stays in the pool.
    """

    def __init__(
        self,
        *,
        max_connections: int = MAX_CONNECTIONS,
        keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S,
    ) -> None:
        super().__init__(
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=keepalive_expiry_s,
            ),
            client=self._new_session,
        )

    def _new_session(self) -> aiohttp.ClientSession:
        """The aiohttp session, made on the first request (it needs the running loop)."""
        connector = _Connector(
            limit=self.limits.max_connections,
            limit_per_host=0,
            keepalive_timeout=self.limits.keepalive_expiry,
            ssl=self.ssl_context,
        )
        # backends set no cookies worth keeping; httpx's client keeps its own
        return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; see the class docstring for the errors and the one resend."""
        for resend in (False, True):
            sending = _Sending()
            token = _SENDING.set(sending)
            try:
                response = await super().handle_async_request(request)
            except _SEND_ERRORS as e:
                cause = (e.__cause__ or e) if isinstance(e, httpx.TransportError) else e
                if resend or not (
                    sending.reused
                    and _unanswered(e)
                    and isinstance(request.stream, httpx.ByteStream)
                ):
                    raise _httpx_error(e, request) from cause
                log.info(
                    "backend_request_resent",
                    host=request.url.host,
                    port=request.url.port,
                    error=repr(cause),
                )
                continue
            finally:
                _SENDING.reset(token)
            response.stream = _Body(response.stream, request)  # type: ignore[arg-type]
            return response
        raise AssertionError("unreachable: the second attempt returns or raises")


class BackendClient(httpx.AsyncClient):
    """``httpx.AsyncClient`` whose ``json=`` bodies are written by :func:`fastjson.dumps`
    (orjson; a body may hold ``fastjson.raw`` values, a prompt's ids written once)."""

    def build_request(
        self, method: str, url: Any, *, json: Any = None, headers: Any = None, **kwargs: Any
    ) -> httpx.Request:
        """``AsyncClient.build_request``; a ``json`` body goes as ``content``."""
        if json is not None:
            kwargs["content"] = fastjson.dumps(json)
            headers = httpx.Headers(headers)
            headers.setdefault("Content-Type", "application/json")
        return super().build_request(method, url, headers=headers, **kwargs)


def new_client(
    url: str,
    timeout_s: float,
    transport: httpx.AsyncBaseTransport | None,
    headers: dict[str, str] | None = None,
    *,
    max_connections: int = MAX_CONNECTIONS,
    keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S,
) -> BackendClient:
    """The client of the backend at ``url``: retries off, over a :class:`BackendTransport`
    unless ``transport`` is given (tests).

    Timeouts: a new connection opens within ``min(timeout_s, CONNECT_TIMEOUT_S)``; a call
    has its connection (a pooled one, or a new one opened, waiting while ``max_connections``
    are busy) within ``timeout_s``, which is aiohttp's ``connect`` timeout (httpx's ``pool``);
    every read of the answer comes within ``timeout_s`` of the previous one (the answer of a
    non-streamed sampling call comes at its end: the backend's longest generation must fit).

    Args:
        url: the backend's base URL; request paths are appended to it.
        timeout_s: the read and pool timeouts above, seconds (> 0).
        transport: an httpx transport to use instead (tests), or None.
        headers: sent with every request (``Authorization`` for an API).
        max_connections: connections open at once to this backend.
        keepalive_expiry_s: seconds an idle connection is kept (below the backend's own idle
            timeout).
    """
    return new_async_client(
        BACKEND_CALL,
        timeout_s=timeout_s,
        base_url=url,
        headers=headers,
        transport=transport
        or BackendTransport(max_connections=max_connections, keepalive_expiry_s=keepalive_expiry_s),
        client_class=BackendClient,
    )


def error_message(response: httpx.Response) -> str:
    """The message of an error answer (``{"error": {"message"}}``, ``{"message"}``,
    ``{"detail"}``, or the text)."""
    try:
        body = json.loads(response.content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.content[:300].decode(errors="replace")
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:500]
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])[:500]
    return str(body)[:300]


def raise_for_status(backend: Backend, response: httpx.Response) -> None:
    """Map an HTTP error answer to the error tree.

    Raises:
        ContextLengthError: a 400 that says the prompt is too long.
        BackendUnavailableError: 503 (loading, overloaded, paused for a weight update).
        BackendError: any other status >= 400 (retryable when the infrastructure's:
            :func:`rolloutd.fault.status_fault`).
    """
    if response.status_code < 400:
        return
    message = error_message(response)
    if response.status_code == 400 and any(h in message.lower() for h in _CONTEXT_HINTS):
        raise ContextLengthError(f"backend {backend.name}: {message}")
    if response.status_code == 503:
        raise BackendUnavailableError(f"backend {backend.name} is not ready: {message}")
    raise BackendError(
        f"backend {backend.name} answered {response.status_code}: {message}",
        retryable=status_fault(response.status_code).retryable,
    )


def transport_error(backend: Backend, error: httpx.HTTPError) -> BackendError:
    """The error of a failed connection or a timeout (the infrastructure's:
    :func:`rolloutd.fault.transport_fault`)."""
    retryable = transport_fault(error).retryable
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
        return BackendUnavailableError(
            f"backend {backend.name} unreachable: {error!r}", retryable=retryable
        )
    if isinstance(error, httpx.TimeoutException):
        return BackendError(f"backend {backend.name} timed out: {error!r}", retryable=retryable)
    return BackendError(f"backend {backend.name} failed: {error!r}", retryable=retryable)


async def post_json(
    backend: Backend, client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> dict[str, Any]:
    """POST ``body`` and return the JSON object answered.

    Raises:
        BackendError: transport failure, error status, or an answer that is not an object.
    """
    try:
        response = await client.post(path, json=body)
    except httpx.HTTPError as e:
        raise transport_error(backend, e) from e
    raise_for_status(backend, response)
    try:
        answer = fastjson.loads(response.content)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BackendError(f"backend {backend.name} answered non-JSON") from e
    if not isinstance(answer, dict):
        raise BackendError(f"backend {backend.name} answered {type(answer).__name__}")
    return answer


async def sse_events(
    backend: Backend, client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> AsyncIterator[dict[str, Any]]:
    """POST ``body`` and yield each ``data: {json}`` event until ``data: [DONE]`` or the end.

    Raises:
        BackendError: transport failure, error status, a malformed event, or an event that
            carries an error.
    """
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code >= 400:
                await response.aread()
                raise_for_status(backend, response)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                try:
                    event = json.loads(payload)
                except json.JSONDecodeError as e:
                    raise BackendError(f"backend {backend.name}: malformed stream event") from e
                if not isinstance(event, dict):
                    raise BackendError(f"backend {backend.name}: stream event is not an object")
                if event.get("error") or event.get("object") == "error":
                    raise BackendError(
                        f"backend {backend.name} stream error: "
                        f"{event.get('error') or event.get('message')}"
                    )
                yield event
    except httpx.HTTPError as e:
        raise transport_error(backend, e) from e


def float_list(values: Any, where: str) -> list[float]:
    """``values`` as floats; None entries (no logprob) are refused.

    Raises:
        BackendError: not a list of numbers.
    """
    if not isinstance(values, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in values
    ):
        raise BackendError(f"{where}: logprobs are not a list of numbers")
    return [float(v) for v in values]


def int_list(values: Any, where: str) -> list[int]:
    """``values`` as token ids.

    Raises:
        BackendError: not a list of integers.
    """
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise BackendError(f"{where}: token ids are not a list of integers")
    return list(values)


class HttpBackend(Backend):
    """A backend reached over HTTP through one :class:`BackendClient` (retries off: Temporal
    owns retries, and a retried call here could sample twice).

    Args:
        name: pool name.
        url: base URL.
        policy_version: version of the served weights.
        timeout_s: limit of one call, seconds (see :func:`new_client`).
        ctx_size: context window of one sequence, in tokens; None asks the backend once.
        transport: httpx transport (tests).
        headers: sent with every request (``Authorization`` for an API).
        logprob_mode: the operator's statement of the server's log-prob mode (None: the
            kind's).
    """

    def __init__(
        self,
        name: str,
        url: str,
        *,
        policy_version: int = 0,
        timeout_s: float = 600.0,
        ctx_size: int | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: dict[str, str] | None = None,
        logprob_mode: LogprobMode | None = None,
    ) -> None:
        super().__init__(name, url, policy_version=policy_version, logprob_mode=logprob_mode)
        self.client = new_client(self.url, timeout_s, transport, headers)
        self._ctx_size = ctx_size

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.client.aclose()

    async def _cached_ctx_size(self, path: str, read: Callable[[Any], Any], what: str) -> int:
        """The context window: ``int(read(body))`` of the JSON answered to ``GET path``, asked
        once and cached.

        Raises:
            BackendError: the call fails, or ``read`` finds no integer (``what`` names it).
        """
        if self._ctx_size is None:
            try:
                response = await self.client.get(path)
            except httpx.HTTPError as e:
                raise transport_error(self, e) from e
            raise_for_status(self, response)
            try:
                self._ctx_size = int(read(response.json()))
            except (ValueError, KeyError, IndexError, TypeError) as e:
                raise BackendError(f"backend {self.name}: {path} has no {what}") from e
        return self._ctx_size
