"""Which server answers at a URL: the check made of an engine rolloutd does not run, before
anything is started on it (``rolloutd up --engine-url``), and by ``rolloutd status`` of every
engine the stack uses.

Each kind is asked on the route only its own server answers with that field, the field its
backend client reads its context window from (:mod:`rolloutd.proxy.backends`): llama-server's
``GET /props`` (``default_generation_settings.n_ctx``), vLLM's ``GET /v1/models``
(``max_model_len``), SGLang's ``GET /get_model_info`` (``context_length``). An
OpenAI-compatible API has no such field: it must list its models on ``GET /v1/models``
(OpenAI API reference, "List models"). So a URL that answers, but not as the kind it was given
(a llama-server named ``vllm``), is told apart from one that does not answer at all. The model
names come from ``GET /v1/models``, which all four serve.

Plain httpx (:func:`rolloutd.http_client.new_async_client`), not the gateway's backend
clients: ``rolloutd status`` runs with rolloutd's client install.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from rolloutd.http_client import HEALTH_PROBE, new_async_client

#: the kinds of engine a user brings (``verl`` is the verl bridge's, never a user's engine)
EngineKind = Literal["llama_cpp", "vllm", "sglang", "openai"]
ENGINE_KINDS: tuple[str, ...] = ("llama_cpp", "vllm", "sglang", "openai")
#: per kind: the route, and the path to the field in its JSON answer ("*": the first item of
#: a list) that says a server is of that kind (module docstring)
KIND_ROUTES: dict[str, tuple[str, tuple[str, ...]]] = {
    "llama_cpp": ("/props", ("default_generation_settings", "n_ctx")),
    "vllm": ("/v1/models", ("data", "*", "max_model_len")),
    "sglang": ("/get_model_info", ("context_length",)),
    "openai": ("/v1/models", ("data",)),
}


def kind_route(kind: str) -> str:
    """``GET /props (default_generation_settings.n_ctx)``: what a server of ``kind`` answers."""
    path, keys = KIND_ROUTES[kind]
    return f"GET {path} ({'.'.join(k for k in keys if k != '*')})"


@dataclass
class EngineCheck:
    """What a server at one URL answered.

    Attributes:
        url: its base URL.
        kind: the kind it was asked as.
        answers: it answered at all (any HTTP status).
        is_kind: it answered as that kind (:data:`KIND_ROUTES`).
        error: why not, when it did not (None when it answers as its kind).
        context_size: context window of one sequence, tokens (None: not known).
        models: the model names ``GET /v1/models`` lists (empty: none listed).
    """

    url: str
    kind: str
    answers: bool = False
    is_kind: bool = False
    error: str | None = None
    context_size: int | None = None
    models: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """One line: ``answers (llama_cpp, context 4096 tokens, serves X)``, or why not."""
        if self.is_kind:
            ctx = f", context {self.context_size} tokens" if self.context_size else ""
            models = f", serves {', '.join(self.models)}" if self.models else ""
            return f"answers ({self.kind}{ctx}{models})"
        if self.answers:
            return f"answers, but not as {self.kind}: {self.error}"
        return f"does not answer: {self.error}"


def _dig(body: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        body = body[0] if key == "*" else body[key]
    return body


async def _get(http: httpx.AsyncClient, path: str) -> tuple[int, Any]:
    response = await http.get(path)
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, None


async def check_engine(
    kind: str,
    url: str,
    *,
    api_key: str | None = None,
    timeout_s: float | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> EngineCheck:
    """Ask the server at ``url`` whether it answers, and as ``kind``.

    Args:
        kind: one of :data:`ENGINE_KINDS`.
        url: base URL, without ``/v1``.
        api_key: sent as ``Authorization: Bearer`` (vLLM ``--api-key``, llama-server
            ``--api-key``).
        timeout_s: limit of each request, seconds; None: the health-probe profile's (5 s).
        transport: httpx transport (tests).

    Returns:
        The check; never raises for what the server answered or failed to.

    Raises:
        KeyError: an unknown kind.
    """
    path, keys = KIND_ROUTES[kind]
    check = EngineCheck(url=url.rstrip("/"), kind=kind)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with new_async_client(
        HEALTH_PROBE, timeout_s=timeout_s, base_url=check.url, headers=headers, transport=transport
    ) as http:
        try:
            status, body = await _get(http, path)
        except httpx.HTTPError as e:  # refused, reset, timed out: no answer
            check.error = f"{type(e).__name__}: {e}"
            return check
        check.answers = True
        try:
            if status >= 400:
                raise ValueError(f"answered {status}")
            value = _dig(body, keys)
            if kind == "openai":
                check.models = [str(m["id"]) for m in value]
            elif not isinstance(value, int) or value < 1:
                raise ValueError(f"{value!r} is no context size")
            else:
                check.context_size = value
        except (ValueError, KeyError, IndexError, TypeError) as e:
            reason = str(e) if isinstance(e, ValueError) else f"no {'.'.join(keys)}"
            check.error = f"{kind_route(kind)}: {reason}"
            return check
        check.is_kind = True
        if kind != "openai":
            try:  # the names are for the eye and the served-name default; not every
                # server of the kind lists them
                status, body = await _get(http, "/v1/models")
                if status < 400:
                    check.models = [str(m["id"]) for m in body["data"]]
            except (httpx.HTTPError, KeyError, TypeError):
                pass
    return check


def check_engines(asks: Sequence[tuple[str, str, str | None]]) -> list[EngineCheck]:
    """:func:`check_engine` of each ``(kind, url, api_key)``, all at once, in order."""

    async def ask() -> list[EngineCheck]:
        return list(await asyncio.gather(*(check_engine(k, u, api_key=a) for k, u, a in asks)))

    return asyncio.run(ask())
