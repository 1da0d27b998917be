"""What a backend is, durably: its spec, the pool's stored state, and the client made from a
spec (:func:`make_backend`).

The pool (:mod:`.pool`) writes its state under :data:`POOL_KEY` before a change takes effect.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import httpx
from pydantic import Field, model_validator

from rolloutd.errors import ConfigError
from rolloutd.payload import Payload
from rolloutd.proxy.backends.base import Backend
from rolloutd.proxy.backends.llama_cpp import LlamaCppBackend
from rolloutd.proxy.backends.openai_compat import OpenAIChatBackend
from rolloutd.proxy.backends.sglang import SglangBackend
from rolloutd.proxy.backends.verl import VerlBackend
from rolloutd.proxy.backends.vllm import VllmBackend
from rolloutd.store import BlobStore
from rolloutd.types import LogprobMode

#: the stored pool's blob-store key
POOL_KEY = "gateway/backend_pool.json"
#: the kinds of backend client
BackendType = Literal["llama_cpp", "vllm", "sglang", "openai", "verl"]
#: ``(num_hidden_layers, num_experts_per_tok)`` of an MoE model
RoutedExpertsShape = tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]]


def options_problem(
    backend_type: str, return_routed_experts: bool, routed_experts_shape: Any
) -> str | None:
    """Why these routed-experts options do not fit a backend of ``backend_type``, or None:
    only an ``sglang`` backend is asked for them (vLLM returns them whenever its server runs
    with ``--enable-return-routed-experts``, shaped; the other kinds have none)."""
    if backend_type != "sglang" and (return_routed_experts or routed_experts_shape is not None):
        return (
            "return_routed_experts and routed_experts_shape apply to an sglang backend only, "
            f"not {backend_type}"
        )
    return None


#: which sessions a backend serves: the policy's (harness sessions, weight sync, policy
#: versions) or a judge's (judge sessions only: never reloaded by a weight sync, never trainable)
PoolName = Literal["policy", "judge"]


def backend_urls(setting: str | None) -> list[str]:
    """Backend URLs from ``settings.backend_url``: one URL, or several separated by commas."""
    if not setting:
        return []
    return [url.strip().rstrip("/") for url in setting.split(",") if url.strip()]


def make_backend(
    backend_type: str,
    name: str,
    url: str,
    *,
    policy_version: int = 0,
    timeout_s: float = 600.0,
    ctx_size: int | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    api_key: str | None = None,
    logprob_mode: LogprobMode | None = None,
    return_routed_experts: bool = False,
    routed_experts_shape: tuple[int, int] | None = None,
) -> Backend:
    """A backend client of ``backend_type`` (``llama_cpp``, ``vllm``, ``sglang``, ``openai``,
    ``verl``: verl's server manager behind the verl bridge's endpoint); with ``api_key``, every
    request carries ``Authorization: Bearer {api_key}``. ``logprob_mode``,
    ``return_routed_experts`` and ``routed_experts_shape`` are :class:`BackendSpec`'s.

    Raises:
        ConfigError: an unknown type, or routed-experts options for a kind other than sglang.
    """
    kinds: dict[str, type[Backend]] = {
        "llama_cpp": LlamaCppBackend,
        "vllm": VllmBackend,
        "verl": VerlBackend,
        "sglang": SglangBackend,
        "openai": OpenAIChatBackend,
    }
    if backend_type not in kinds:
        raise ConfigError(f"unknown backend type {backend_type!r}; known: {', '.join(kinds)}")
    if problem := options_problem(backend_type, return_routed_experts, routed_experts_shape):
        raise ConfigError(problem)
    options: dict[str, Any] = {"logprob_mode": logprob_mode}
    if backend_type == "sglang":
        options |= {
            "return_routed_experts": return_routed_experts,
            "routed_experts_shape": routed_experts_shape,
        }
    auth = (
        {"api_key": api_key}
        if backend_type == "openai"
        else {"headers": {"Authorization": f"Bearer {api_key}"}}
    )
    return kinds[backend_type](
        name,
        url,
        policy_version=policy_version,  # type: ignore[call-arg]
        timeout_s=timeout_s,
        ctx_size=ctx_size,
        transport=transport,
        **(auth if api_key else {}),
        **options,
    )


class BackendSpec(Payload):
    """One backend as the store keeps it."""

    name: str = Field(
        min_length=1, max_length=512, description="stable name; sessions are pinned by it"
    )
    type: BackendType = Field(default="llama_cpp", description="client kind")
    url: str = Field(
        min_length=1, max_length=2048, description="base URL, without a trailing slash"
    )
    policy_version: int = Field(
        default=0, ge=0, description="weights version stamped on its completions (>= 0)"
    )
    paused: bool = Field(default=False, description="grants no new lease (weight sync in progress)")
    pool: PoolName = Field(
        default="policy",
        description="the sessions it serves: ``policy`` (harnesses; what weight sync, pause "
        "and policy versions address by default) or ``judge`` (judge sessions only)",
    )
    added_at: float = Field(default=0.0, description="Unix time (s) it was registered")
    logprob_mode: LogprobMode | None = Field(
        default=None,
        description="what its logprobs are, when the server runs otherwise than its kind's "
        "default (docs/backends.md): ``processed`` for a vLLM started with ``--logprobs-mode "
        "processed_logprobs``, ``raw`` for an SGLang with ``SGLANG_RETURN_ORIGINAL_LOGPROB``; "
        "stamped on its completions. None: its kind's",
    )
    return_routed_experts: bool = Field(
        default=False,
        description="sglang: ask every call for the experts each token was routed to (R3); "
        "the server must run with ``--enable-return-routed-experts``",
    )
    routed_experts_shape: RoutedExpertsShape | None = Field(
        default=None,
        description="sglang: ``(num_hidden_layers, num_experts_per_tok)`` of the served MoE "
        "model (its config), to shape the flat expert ids SGLang returns; None: one row of "
        "``layers x top_k`` ids per token",
    )

    @model_validator(mode="after")
    def _options_fit_the_kind(self) -> BackendSpec:
        if problem := options_problem(
            self.type, self.return_routed_experts, self.routed_experts_shape
        ):
            raise ValueError(problem)
        return self

    def client_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`make_backend` this spec sets."""
        return {
            "logprob_mode": self.logprob_mode,
            "return_routed_experts": self.return_routed_experts,
            "routed_experts_shape": self.routed_experts_shape,
        }


class PoolState(Payload):
    """The durable pool (``gateway/backend_pool.json``)."""

    backends: list[BackendSpec] = Field(
        default_factory=list,
        description="registered backends, in registration order (ties in assignment go to the "
        "first)",
    )
    managed: bool = Field(
        default=False,
        description="an admin route has changed the pool; it then wins over the settings",
    )
    updated_at: float = Field(default=0.0, description="Unix time (s) of the last change")


def type_of(backend: Backend) -> BackendType:
    """The type a backend client is stored as (``openai`` for any other client)."""
    kind = backend.type
    return kind if kind in ("llama_cpp", "vllm", "sglang", "openai", "verl") else "openai"  # type: ignore[return-value]


def load_pool_state(store: BlobStore) -> PoolState | None:
    """The stored pool, or None when none was written."""
    if not store.exists(POOL_KEY):
        return None
    return store.get_model(POOL_KEY, PoolState)
