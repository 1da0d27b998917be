"""A Harbor task's ``task.toml``, read with the standard library and checked field by field.

Harbor (``harbor`` on PyPI, ``harbor.models.task.config.TaskConfig``) writes two forms: the
older one with ``version = "1.0"``, and ``schema_version = "1.1"`` ... ``"1.4"`` (0.25 writes
1.4). Both are read here with :mod:`tomllib` (``harbor`` itself needs Python >= 3.12); the
older form's ``version`` is the newer ``schema_version`` and its ``memory = "4G"`` /
``storage = "10G"`` strings become ``memory_mb`` / ``storage_mb``, as Harbor's own migration
does.

What rolloutd runs, and how (:func:`read_task_config` refuses everything else by name):

- ``[agent]`` ``timeout_sec``, ``network_mode``, ``allowed_hosts`` (empty);
- ``[verifier]`` ``timeout_sec``, ``env``, ``environment_mode`` (``shared``: the verifier sees
  the agent's final file system, in a fresh container), ``network_mode``;
- ``[environment]`` ``docker_image``, ``build_timeout_sec``, ``os = "linux"``, ``cpus``,
  ``memory_mb``, ``storage_mb``, ``allow_internet`` (deprecated for ``network_mode``),
  ``network_mode``, ``workdir``, ``env``, and the empty or zero forms of what it cannot give
  (``gpus = 0``, ``mcp_servers = []``: Terminal-Bench 2.0 writes them);
- ``[solution] env``; ``[task]`` (package name, version, description, authors, keywords) and
  ``[metadata]`` are kept as the task's metadata; ``source``; ``artifacts = []``.

Refused by name, as rolloutd cannot honour them: multi-step tasks (``steps``,
``multi_step_reward_strategy``), artifacts, GPUs and TPUs, MCP servers, skills, healthchecks,
a separate verifier environment (``environment_mode = "separate"``, ``[verifier.environment]``)
and its collect hooks, a run as another user, Windows
containers, host allowlists, and ``${VAR}`` templates in ``env`` (a task file never reads the
submitting host's environment). A field Harbor 0.25 does not know either is refused as unknown.
"""

from __future__ import annotations

import math
import re
import tomllib
from typing import Any, Literal

from pydantic import Field, ValidationError

from rolloutd.errors import ConfigError
from rolloutd.payload import Payload, validate_strict

#: the task.toml forms this reader knows (``version = "1.0"`` is the oldest).
SCHEMA_VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4")
#: Harbor's network modes (``harbor.models.task.config.NetworkMode``).
NetworkMode = Literal["no-network", "public", "allowlist"]
#: a ``${VAR}`` / ``${VAR:-default}`` template (Harbor resolves them from the host's environment).
_ENV_TEMPLATE = re.compile(r"\$\{[^}]*\}")

#: fields Harbor 0.25 knows and rolloutd cannot honour, by section: field -> why. A field is
#: refused unless its value is one of the "asks nothing" values in :data:`_HARMLESS`.
_UNSUPPORTED: dict[str, dict[str, str]] = {
    "": {
        "steps": "multi-step tasks are not supported",
        "multi_step_reward_strategy": "multi-step tasks are not supported",
        "artifacts": "artifact collection is not supported; write results under the workdir",
    },
    "agent": {"user": "the agent runs as the image's user"},
    "verifier": {
        "environment": "a separate verifier environment is not supported",
        "collect": "collect hooks need compose services, which are not supported",
        "user": "the verifier runs as the image's user",
    },
    "environment": {
        "gpus": "rolloutd's runtimes give no GPU",
        "gpu_types": "rolloutd's runtimes give no GPU",
        "tpu": "rolloutd's runtimes give no TPU",
        "mcp_servers": "MCP servers are not supported",
        "skills_dir": "agent skills are not supported",
        "healthcheck": "healthchecks are not supported",
    },
}
#: values of an unsupported field that ask for nothing (Terminal-Bench 2.0 writes them).
_HARMLESS: tuple[Any, ...] = (None, 0, [], {}, "root", 0.0)


class HarborAgentConfig(Payload):
    """``[agent]``: the agent phase."""

    timeout_sec: float | None = Field(default=None, gt=0, description="run budget, s")
    network_mode: NetworkMode | None = Field(default=None, description="agent network policy")
    allowed_hosts: list[str] | None = Field(default=None, description="allowlist hosts")


class HarborVerifierConfig(Payload):
    """``[verifier]``: the verifier phase (``tests/test.sh``)."""

    timeout_sec: float = Field(default=600.0, gt=0, description="test.sh budget, s")
    env: dict[str, str] = Field(default_factory=dict, description="test.sh's environment")
    environment_mode: Literal["shared"] | None = Field(
        default=None,
        description="shared: the agent's file system (the default; 'separate' is refused)",
    )
    network_mode: NetworkMode | None = Field(default=None, description="verifier network")
    allowed_hosts: list[str] | None = Field(default=None, description="allowlist hosts")


class HarborEnvironmentConfig(Payload):
    """``[environment]``: the task's container."""

    build_timeout_sec: float = Field(default=600.0, gt=0, description="image build budget, s")
    docker_image: str | None = Field(default=None, description="a pre-built image")
    os: Literal["linux"] = Field(default="linux", description="container OS")
    cpus: float | None = Field(default=None, gt=0, description="CPU limit, cores")
    memory_mb: int | None = Field(default=None, ge=16, description="memory limit, MiB")
    storage_mb: int | None = Field(default=None, ge=1, description="disk limit, MiB")
    env: dict[str, str] = Field(default_factory=dict, description="container environment")
    workdir: str | None = Field(default=None, description="overrides the image's WORKDIR")
    network_mode: NetworkMode | None = Field(default=None, description="baseline network")
    allowed_hosts: list[str] | None = Field(default=None, description="allowlist hosts")
    allow_internet: bool | None = Field(
        default=None, description="deprecated: true is network_mode public, false no-network"
    )


class HarborSolutionConfig(Payload):
    """``[solution]``: the reference solution's environment."""

    env: dict[str, str] = Field(default_factory=dict)


class HarborAuthor(Payload):
    """One author of ``[task]``."""

    name: str
    email: str | None = None


class HarborPackage(Payload):
    """``[task]``: the task's package identity (``org/name``)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
    version: str | None = Field(default=None, min_length=1)
    description: str = ""
    authors: list[HarborAuthor] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)


class HarborTaskConfig(Payload):
    """A task.toml as rolloutd reads it: what it runs, nothing it would ignore."""

    schema_version: str = Field(
        default="1.4", description="the form (``version`` of the 1.0 form is read as this)"
    )
    task: HarborPackage | None = Field(default=None, description="``[task]``, when present")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="``[metadata]``, free-form and kept"
    )
    agent: HarborAgentConfig = Field(default_factory=HarborAgentConfig, description="``[agent]``")
    verifier: HarborVerifierConfig = Field(
        default_factory=HarborVerifierConfig, description="``[verifier]``"
    )
    environment: HarborEnvironmentConfig = Field(
        default_factory=HarborEnvironmentConfig, description="``[environment]``"
    )
    solution: HarborSolutionConfig = Field(
        default_factory=HarborSolutionConfig, description="``[solution]``"
    )
    source: str | None = Field(default=None, description="where the task came from (free text)")

    def network(self, phase: Literal["agent", "verifier"]) -> NetworkMode | None:
        """The network mode a phase asks for, or None when the task.toml sets none.

        A phase's own ``network_mode`` wins, then the environment's (``allow_internet`` is
        ``public`` / ``no-network`` where ``network_mode`` is not set), as Harbor resolves it.
        Harbor's default when nothing is set is ``public``; rolloutd's is the sandbox policy's
        (see :func:`rolloutd.tasksets.harbor.runtime_network`).
        """
        own = self.agent.network_mode if phase == "agent" else self.verifier.network_mode
        if own is not None:
            return own
        env = self.environment
        if env.network_mode is not None:
            return env.network_mode
        if env.allow_internet is not None:
            return "public" if env.allow_internet else "no-network"
        return None


def _size_mb(value: Any, field: str) -> int:
    """Harbor's legacy size strings (``"4G"``, ``"512M"``, ``"1024K"``) in MiB."""
    text = str(value).strip().upper()
    units = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    if not text or text[-1] not in units:
        raise ConfigError(f"task.toml [environment] {field} = {value!r}: use a size like '4G'")
    try:
        return int(float(text[:-1]) * units[text[-1]])
    except ValueError:
        raise ConfigError(f"task.toml [environment] {field} = {value!r} is not a size") from None


def _refuse_unsupported(data: dict[str, Any]) -> None:
    for section, fields in _UNSUPPORTED.items():
        table = data if not section else data.get(section)
        if not isinstance(table, dict):
            continue
        for field, why in fields.items():
            if field in table and table[field] not in _HARMLESS:
                where = f"[{section}] {field}" if section else field
                raise ConfigError(f"task.toml {where} is not supported by rolloutd: {why}")
            table.pop(field, None)
    environment = data.get("environment")
    if isinstance(environment, dict) and str(environment.get("os", "linux")).lower() != "linux":
        raise ConfigError(
            f"task.toml [environment] os = {environment['os']!r} is not supported by "
            "rolloutd: its runtimes are Linux containers"
        )
    verifier = data.get("verifier")
    if isinstance(verifier, dict) and verifier.get("environment_mode") == "separate":
        raise ConfigError(
            "task.toml [verifier] environment_mode = 'separate' is not supported by rolloutd: "
            "its verifier runs on the agent's final file system (in a fresh container)"
        )
    for section in ("agent", "verifier", "environment"):
        table = data.get(section)
        if isinstance(table, dict) and table.get("network_mode") == "allowlist":
            raise ConfigError(
                f"task.toml [{section}] network_mode = 'allowlist' is not supported by "
                "rolloutd: its runtimes reach the session's gateway only, or nothing, or the "
                "network the sandbox policy grants"
            )
        if isinstance(table, dict) and table.get("allowed_hosts"):
            raise ConfigError(
                f"task.toml [{section}] allowed_hosts is not supported by rolloutd "
                "(host allowlists are not enforced by its runtimes)"
            )
    for section in ("verifier", "environment", "solution"):
        table = data.get(section)
        env = table.get("env") if isinstance(table, dict) else None
        for name, value in (env or {}).items():
            if isinstance(value, str) and _ENV_TEMPLATE.search(value):
                raise ConfigError(
                    f"task.toml [{section}.env] {name} = {value!r}: ${{VAR}} templates are "
                    "not supported by rolloutd (a task file never reads the submitting "
                    "host's environment); write the value"
                )


def _migrate(data: dict[str, Any]) -> dict[str, Any]:
    """The 1.0 form's names as the newer form's (Harbor's own migration)."""
    if "version" in data:
        if "schema_version" in data:
            raise ConfigError("task.toml sets both version and schema_version")
        data["schema_version"] = data.pop("version")
    environment = data.get("environment")
    if isinstance(environment, dict):
        for legacy, field in (("memory", "memory_mb"), ("storage", "storage_mb")):
            if legacy in environment:
                size = _size_mb(environment.pop(legacy), legacy)
                if environment.get(field, size) != size:
                    raise ConfigError(
                        f"task.toml [environment] {legacy} and {field} disagree "
                        f"({size} MiB and {environment[field]} MiB)"
                    )
                environment[field] = size
        cpus = environment.get("cpus")
        if isinstance(cpus, float) and not math.isfinite(cpus):
            raise ConfigError(f"task.toml [environment] cpus = {cpus} is not finite")
    return data


def parse_task_config(text: str, *, where: str = "task.toml") -> HarborTaskConfig:
    """Parse and check a task.toml's text.

    Args:
        text: the file's text (TOML 1.0).
        where: the file's name in error messages.

    Returns:
        The :class:`HarborTaskConfig`.

    Raises:
        ConfigError: not TOML, an unknown schema version, a field rolloutd does not support
            (named, with why), or a malformed value (named by its dotted path).
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not TOML: {e}") from None
    data = _migrate(data)
    version = str(data.get("schema_version", "1.4"))
    if version not in SCHEMA_VERSIONS:
        raise ConfigError(
            f"{where}: schema_version {version!r} is unknown; rolloutd reads "
            f"{', '.join(SCHEMA_VERSIONS)}"
        )
    data["schema_version"] = version
    try:
        _refuse_unsupported(data)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e.message}") from None
    try:
        return validate_strict(HarborTaskConfig, data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: " + err["msg"]
            for err in e.errors()
        )
        raise ConfigError(f"{where}: {problems}") from None
