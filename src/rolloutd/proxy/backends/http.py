"""What every HTTP backend shares: a client without retries, status and transport mapping,
and an SSE line reader.

Temporal owns retries (STYLE.md): a retried sampling call here could sample twice.

The model call's POST to an ``http://`` backend goes over :class:`rolloutd.proxy.backends.
keepalive.KeepAlivePool` (httptools-parsed keep-alive connections: 31 us of CPU per call on a
loopback backend against 176 us through aiohttp's client and 650 us through httpcore's). The
rest speaks httpx; underneath, the connections are aiohttp's (``httpx-aiohttp``, the transport
the OpenAI and Anthropic Python SDKs offer for the same reason). Both raise the httpx errors
httpcore raises for the same failures, so :func:`transport_error` maps them once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import yarl
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import map_aiohttp_exceptions

from rolloutd.errors import BackendError, BackendUnavailableError, ContextLengthError
from rolloutd.proxy import fastjson
from rolloutd.proxy.backends.base import Backend
from rolloutd.proxy.backends.keepalive import KeepAlivePool

_CONTEXT_HINTS = ("maximum context length", "context length", "exceed_context_size",
                  "longer than the model")


def _httpx_error(error: BaseException, request: httpx.Request | None) -> BaseException:
    """The httpx error httpcore raised for aiohttp's ``error`` (see :class:`BackendTransport`),
    or ``error`` itself when httpx-aiohttp's own mapping already holds."""
    cause = error.__cause__ if isinstance(error, httpx.TransportError) else error
    if isinstance(cause, aiohttp.ClientConnectorError):
        return httpx.ConnectError(str(cause), request=request)
    if isinstance(cause, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError(str(cause), request=request)
    if isinstance(error, httpx.TransportError):
        return error
    return httpx.RemoteProtocolError(f"{type(error).__name__}: {error}", request=request)


class BackendTransport(AiohttpTransport):
    """httpx-aiohttp's transport with aiohttp's failures as the httpx errors httpcore raises
    for them: a refused connection is ``ConnectError``, a backend that drops the connection
    mid-answer ``RemoteProtocolError`` (httpx-aiohttp maps the latter to ``ConnectTimeout``),
    a malformed answer ``RemoteProtocolError`` (unmapped there), timeouts as httpx-aiohttp
    maps them (``ReadTimeout``, ``TimeoutException``), so :func:`transport_error` reports
    each as before.

    :meth:`post_bytes` is the model call's path: aiohttp's session directly, without the
    httpx request and response layers around it (a third of the call's CPU), with the same
    errors."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; see the class docstring for the errors."""
        try:
            return await super().handle_async_request(request)
        except (httpx.TransportError, aiohttp.ClientError) as e:
            raise _httpx_error(e, request) from (e.__cause__ or e)

    async def post_bytes(self, url: str | yarl.URL, content: bytes, headers: dict[str, str],
                         timeout: aiohttp.ClientTimeout) -> tuple[int, bytes]:
        """POST ``content`` to ``url`` and read the whole answer.

        Returns:
            ``(status code, body)``.

        Raises:
            httpx.TransportError: as :meth:`handle_async_request` raises them.
        """
        if not isinstance(self.client, aiohttp.ClientSession):
            self.client = self.get_client()
        try:
            with map_aiohttp_exceptions():
                async with self.client.post(url, data=content, headers=headers,
                                            allow_redirects=False, auto_decompress=False,
                                            compress=False, timeout=timeout) as response:
                    return response.status, await response.read()
        except (httpx.TransportError, aiohttp.ClientError) as e:
            raise _httpx_error(e, None) from (e.__cause__ or e)


class Answer:
    """A backend's whole answer to a model call's POST: what the backends read of an
    ``httpx.Response`` (``status_code``, ``content``, ``text``), without building one (15 us
    a call).

    Args:
        status_code: the HTTP status.
        content: the body, bytes.
    """

    __slots__ = ("content", "status_code")

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    @property
    def text(self) -> str:
        """The body decoded as UTF-8 (undecodable bytes replaced)."""
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON.

        Raises:
            json.JSONDecodeError: it is not JSON.
            UnicodeDecodeError: it is not UTF-8.
        """
        return fastjson.loads(self.content)


class ShardedClient:
    """Several ``httpx.AsyncClient`` pools used in turn, each with a few connections.

    The shards were made for httpcore's pool, which checks every pooled connection on each
    request (with 64 concurrent calls one pool spent most of the gateway's CPU there); with
    aiohttp's pool underneath (:class:`BackendTransport`, the default) they only bound the
    connections of each pool. The methods used by the backends are forwarded.

    :meth:`post` with a ``json`` body (the model call) sends with the client's base URL,
    headers and timeout through ``keepalive`` (:class:`rolloutd.proxy.backends.keepalive.
    KeepAlivePool`: ``http://`` origins), else :meth:`BackendTransport.post_bytes`, else the
    shard's transport (tests): the client layers (auth, redirects, cookies, event hooks) and
    httpx's request and response streams cost more than half of a call's CPU and are unused
    here. Its answer is an :class:`Answer` (a read ``httpx.Response`` through a test's
    transport).

    Args:
        make: builds one shard: ``(client, its transport)``.
        num_shards: number of pools (>= 1).
        base_url: the clients' base URL.
        headers: headers of every request (besides ``Host``, ``Content-Type`` and length).
        timeout: the clients' timeout.
        keepalive: the model call's connections, or None.
    """

    def __init__(self, make: Any, num_shards: int, *, base_url: str = "",
                 headers: dict[str, str] | None = None,
                 timeout: httpx.Timeout | None = None,
                 keepalive: KeepAlivePool | None = None) -> None:
        self.keepalive = keepalive
        pairs = [make() for _ in range(max(1, num_shards))]
        self.shards: list[httpx.AsyncClient] = [client for client, _ in pairs]
        self._transports: list[httpx.AsyncBaseTransport] = [t for _, t in pairs]
        self._base_url = base_url.rstrip("/")
        self._headers = [("Accept", "application/json"), ("Content-Type", "application/json"),
                         *(headers or {}).items()]
        self._timeout = (timeout or httpx.Timeout(600.0)).as_dict()
        self._aiohttp_timeout = aiohttp.ClientTimeout(sock_connect=self._timeout["connect"],
                                                      sock_read=self._timeout["read"],
                                                      connect=self._timeout["pool"])
        self._header_dict = dict(self._headers)
        self._urls: dict[str, httpx.URL] = {}  # parsed once per path
        self._yarl_urls: dict[str, yarl.URL] = {}
        self._next = 0

    def _pick(self) -> httpx.AsyncClient:
        self._next = (self._next + 1) % len(self.shards)
        return self.shards[self._next]

    async def post(self, url: str, *, json: Any = None,
                   **kwargs: Any) -> Answer | httpx.Response:
        """``AsyncClient.post`` on the next shard; a JSON body skips the client layers."""
        if json is None or kwargs:
            return await self._pick().post(url, json=json, **kwargs)
        if self.keepalive is not None:
            return Answer(*await self.keepalive.post(url, fastjson.dumps(json)))
        self._next = (self._next + 1) % len(self.shards)
        transport = self._transports[self._next]
        if isinstance(transport, BackendTransport):
            address = self._yarl_urls.get(url)
            if address is None:
                address = self._yarl_urls[url] = yarl.URL(self._base_url + url)
            return Answer(*await transport.post_bytes(
                address, fastjson.dumps(json), self._header_dict, self._aiohttp_timeout))
        target = self._urls.get(url)
        if target is None:
            target = self._urls[url] = httpx.URL(self._base_url + url)
        request = httpx.Request(
            "POST", target, headers=self._headers,
            content=fastjson.dumps(json),
            extensions={"timeout": self._timeout})
        response = await self._transports[self._next].handle_async_request(request)
        try:
            await response.aread()
        finally:
            await response.aclose()
        return response

    async def get(self, url: str, **kwargs: Any) -> httpx.Response:
        """``AsyncClient.get`` on the next shard."""
        return await self._pick().get(url, **kwargs)

    def stream(self, method: str, url: str, **kwargs: Any) -> Any:
        """``AsyncClient.stream`` on the next shard (an async context manager); a ``json``
        body is written by :func:`fastjson.dumps` (it may hold ``fastjson.raw`` values)."""
        if kwargs.get("json") is not None:
            kwargs["content"] = fastjson.dumps(kwargs.pop("json"))
            kwargs["headers"] = {"Content-Type": "application/json",
                                 **(kwargs.get("headers") or {})}
        return self._pick().stream(method, url, **kwargs)

    async def aclose(self) -> None:
        """Close every shard and the model call's connections."""
        if self.keepalive is not None:
            await self.keepalive.aclose()
        for shard in self.shards:
            await shard.aclose()


def new_client(url: str, timeout_s: float, transport: httpx.AsyncBaseTransport | None,
               headers: dict[str, str] | None = None, *, num_shards: int = 8,
               connections_per_shard: int = 16) -> Any:
    """An async client for ``url`` with retries off and ``timeout_s`` per call, sharded
    (:class:`ShardedClient`) unless a transport is given (tests pass one transport); its
    model calls to an ``http://`` ``url`` go over a :class:`KeepAlivePool` of
    ``num_shards * connections_per_shard`` connections."""
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))

    def make() -> tuple[httpx.AsyncClient, httpx.AsyncBaseTransport]:
        shard_transport = transport or BackendTransport(
            limits=httpx.Limits(max_connections=connections_per_shard,
                                max_keepalive_connections=connections_per_shard))
        client = httpx.AsyncClient(
            base_url=url, headers=headers, timeout=timeout,
            limits=httpx.Limits(max_connections=connections_per_shard,
                                max_keepalive_connections=connections_per_shard),
            transport=shard_transport)
        return client, shard_transport

    keepalive = None
    if transport is None and url.startswith("http://"):
        keepalive = KeepAlivePool(url, headers=headers, limit=num_shards * connections_per_shard,
                                  connect_timeout_s=min(timeout_s, 10.0),
                                  read_timeout_s=timeout_s)
    return ShardedClient(make, 1 if transport is not None else num_shards, base_url=url,
                         headers=headers, timeout=timeout, keepalive=keepalive)


def error_message(response: Answer | httpx.Response) -> str:
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


def raise_for_status(backend: Backend, response: Answer | httpx.Response) -> None:
    """Map an HTTP error answer to the error tree.

    Raises:
        ContextLengthError: a 400 that says the prompt is too long.
        BackendUnavailableError: 503 (loading, overloaded, paused for a weight update).
        BackendError: any other status >= 400 (retryable when >= 500).
    """
    if response.status_code < 400:
        return
    message = error_message(response)
    if response.status_code == 400 and any(h in message.lower() for h in _CONTEXT_HINTS):
        raise ContextLengthError(f"backend {backend.name}: {message}")
    if response.status_code == 503:
        raise BackendUnavailableError(f"backend {backend.name} is not ready: {message}")
    raise BackendError(f"backend {backend.name} answered {response.status_code}: {message}",
                       retryable=response.status_code >= 500)


def transport_error(backend: Backend, error: httpx.HTTPError) -> BackendError:
    """The error of a failed connection or a timeout."""
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
        return BackendUnavailableError(f"backend {backend.name} unreachable: {error!r}")
    if isinstance(error, httpx.TimeoutException):
        return BackendError(f"backend {backend.name} timed out: {error!r}")
    return BackendError(f"backend {backend.name} failed: {error!r}")


async def post_json(backend: Backend, client: ShardedClient, path: str,
                    body: dict[str, Any]) -> dict[str, Any]:
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


async def sse_events(backend: Backend, client: ShardedClient, path: str,
                     body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
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
                    raise BackendError(f"backend {backend.name} stream error: "
                                       f"{event.get('error') or event.get('message')}")
                yield event
    except httpx.HTTPError as e:
        raise transport_error(backend, e) from e


def float_list(values: Any, where: str) -> list[float]:
    """``values`` as floats; None entries (no logprob) are refused.

    Raises:
        BackendError: not a list of numbers.
    """
    if not isinstance(values, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise BackendError(f"{where}: logprobs are not a list of numbers")
    return [float(v) for v in values]


def int_list(values: Any, where: str) -> list[int]:
    """``values`` as token ids.

    Raises:
        BackendError: not a list of integers.
    """
    if not isinstance(values, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise BackendError(f"{where}: token ids are not a list of integers")
    return list(values)
