"""What the gateway reads from an incoming HTTP request: the key it carries, its JSON body,
whether the client marks it a retry, its path with the key masked.

The model routes (:mod:`rolloutd.proxy.http.app` and its routers) and the admin routes
(:mod:`rolloutd.proxy.http.admin_routes`) both read requests through these functions, so the
same limits and errors hold on both.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

from rolloutd.errors import InvalidRequestError, RequestTooLargeError
from rolloutd.proxy.core import fastjson

#: a JSON escape of a UTF-16 surrogate (paired or lone): ``\ud800`` to ``\udfff``
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


#: the header the OpenAI and Anthropic Python and TypeScript SDKs send on every call: how many
#: times they retried it (``0`` on the first try; openai/_base_client.py,
#: anthropic/_base_client.py)
RETRY_COUNT_HEADER = "x-stainless-retry-count"


def marked_retry(request: Request) -> bool:
    """Whether the client marks the call as a retry of one it sent before
    (:data:`RETRY_COUNT_HEADER` > 0); a value that is not an integer marks nothing."""
    value = request.headers.get(RETRY_COUNT_HEADER)
    if not value:
        return False
    try:
        return int(value) > 0
    except ValueError:
        return False


def path_kind(request: Request) -> str:
    """The request path with a session key masked (keys are secrets: never logged)."""
    path = request.url.path
    if path.startswith("/s/"):
        _, _, rest = path[3:].partition("/")
        return f"/s/***/{rest}"
    return path


def bearer_key(request: Request) -> str | None:
    """The session key from ``Authorization: Bearer <key>``, or None."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def api_key(request: Request) -> str | None:
    """The session key sent as an API key: ``Authorization: Bearer``, ``x-api-key``
    (Anthropic clients), ``x-goog-api-key`` or ``?key=`` (Gemini clients)."""
    return (
        bearer_key(request)
        or request.headers.get("x-api-key")
        or request.headers.get("x-goog-api-key")
        or request.query_params.get("key")
        or None
    )


async def read_json(
    request: Request,
    max_body_bytes: int,
    *,
    empty: Any = None,
    reader: fastjson.BodyReader | None = None,
) -> Any:
    """The request's JSON body, read up to ``max_body_bytes`` (a chunked body is cut off as
    soon as it passes the limit).

    Args:
        request: the request.
        max_body_bytes: the limit (``settings.max_body_bytes``).
        empty: what an empty body means; None: an empty body is an error.
        reader: the session's :class:`~rolloutd.proxy.core.fastjson.BodyReader` (model calls:
            the conversation the session sent last is not parsed again).

    Raises:
        RequestTooLargeError: larger than ``max_body_bytes`` (413).
        InvalidRequestError: not UTF-8, or not JSON.
    """
    declared = request.headers.get("content-length")
    too_large = f"the request body exceeds the limit of {max_body_bytes} bytes"
    if declared and declared.isdigit() and int(declared) > max_body_bytes:
        raise RequestTooLargeError(too_large)
    raw = bytearray()
    try:
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > max_body_bytes:
                raise RequestTooLargeError(too_large)
    except ClientDisconnect:
        raise InvalidRequestError("the client disconnected before sending its whole body") from None
    if empty is not None and not raw.strip():
        return empty
    try:
        body = fastjson.loads(raw) if reader is None else reader.loads(raw)
        # \ud800-style escapes decode to lone surrogates, which no UTF-8 consumer accepts;
        # only a body with such an escape is serialised again to find out; the text a
        # reader reused was searched in the body it came from
        if _SURROGATE_ESCAPE.search(raw, reader.reused_bytes if reader is not None else 0):
            json.dumps(body, ensure_ascii=False).encode()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"the request body is not valid JSON: {e}") from None
    except UnicodeEncodeError:
        if reader is not None:
            reader.forget()  # what it kept was not checked for these escapes
        raise InvalidRequestError(
            "the request body holds invalid Unicode (a lone surrogate)"
        ) from None
    return body
