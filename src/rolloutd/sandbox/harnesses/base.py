"""The harness-adapter contract (docs/architecture.md, "One session, step by step", step 5).

An adapter writes the harness's config into the runtime, points its provider base URLs and API
keys at the session, and returns the command to run. The activity then runs it::

    adapter = get_harness(task.harness)
    command = await adapter.prepare(runtime, ctx)
    process = await runtime.spawn(command.command, env=command.env, cwd=command.cwd)
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from rolloutd.sandbox.runtimes.base import Runtime
from rolloutd.types import HarnessSpec

#: where adapters put the instruction inside the runtime's HOME (for long instructions).
INSTRUCTION_FILE = ".rolloutd/instruction.md"


class HarnessContext(BaseModel):
    """What a harness needs to know about its session.

    Attributes:
        instruction: the task's instruction, verbatim.
        openai_base_url: the session's OpenAI base URL, ending in ``/v1``
            (``{gateway}/s/{key}/v1``).
        anthropic_base_url: the session's Anthropic base URL (``{gateway}/s/{key}``).
        gemini_base_url: the session's Gemini base URL (``{gateway}/s/{key}``).
        api_key: the session key (also accepted as the API key by the gateway).
        model: the model name the harness sends.
        workdir: the working folder inside the runtime; None: the runtime's workdir.
    """

    model_config = ConfigDict(extra="forbid")

    instruction: str = Field(min_length=1)
    openai_base_url: str
    anthropic_base_url: str | None = None
    gemini_base_url: str | None = None
    api_key: str
    model: str
    workdir: str | None = None


class HarnessCommand(BaseModel):
    """The command an adapter asks the runtime to run.

    Attributes:
        command: argv, or a shell string run by ``/bin/sh -c``.
        env: environment on top of the runtime's base environment (holds the session key:
            never log it).
        cwd: working folder inside the runtime.
    """

    model_config = ConfigDict(extra="forbid")

    command: str | list[str]
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None


class HarnessAdapter(abc.ABC):
    """Configures one harness for one session.

    Args:
        spec: the task's harness spec.
    """

    type: ClassVar[str] = "abstract"

    def __init__(self, spec: HarnessSpec) -> None:
        self.spec = spec

    @classmethod
    def cli_version(cls) -> str | None:
        """The version of this harness's CLI on this host, published to the fleet registry
        (:mod:`rolloutd.capabilities`) so that submit refuses a harness no host can run.

        Returns:
            The CLI's version, or None when the harness needs no CLI.

        Raises:
            HarnessError: the CLI is not installed on this host.
        """
        return None

    @abc.abstractmethod
    async def prepare(self, runtime: Runtime, ctx: HarnessContext) -> HarnessCommand:
        """Write the harness's config into ``runtime`` and return the command to run.

        Args:
            runtime: a started runtime.
            ctx: the session's URLs, key, model and instruction.

        Returns:
            The :class:`HarnessCommand`.

        Raises:
            HarnessError: the harness is not installed or cannot be configured.
        """

    def summarize(self, stdout: str) -> dict[str, Any] | None:
        """What the harness's own output says of the run (errors it hid behind exit 0), or None.

        Args:
            stdout: the harness's standard output.
        """
        return None

    def session_env(self, runtime: Runtime, ctx: HarnessContext) -> dict[str, str]:
        """Provider variables every harness gets, then ``spec.env`` on top.

        Returns:
            ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``OPENAI_MODEL``, the Anthropic and Gemini
            equivalents when their URLs are set, and ``ROLLOUTD_INSTRUCTION_FILE``.
        """
        env = {
            "OPENAI_BASE_URL": ctx.openai_base_url,
            "OPENAI_API_KEY": ctx.api_key,
            "OPENAI_MODEL": ctx.model,
            "ROLLOUTD_INSTRUCTION_FILE": f"{runtime.home}/{INSTRUCTION_FILE}",
        }
        if ctx.anthropic_base_url:
            env |= {
                "ANTHROPIC_BASE_URL": ctx.anthropic_base_url,
                "ANTHROPIC_API_KEY": ctx.api_key,
                "ANTHROPIC_MODEL": ctx.model,
            }
        if ctx.gemini_base_url:
            env |= {
                "GOOGLE_GEMINI_BASE_URL": ctx.gemini_base_url,
                "GEMINI_API_KEY": ctx.api_key,
                "GEMINI_MODEL": ctx.model,
            }
        return env | self.spec.env

    async def write_instruction(self, runtime: Runtime, ctx: HarnessContext) -> str:
        """Write the instruction to ``$HOME/.rolloutd/instruction.md`` in the runtime.

        A file has no size limit, unlike one argv string or variable (128 KiB on Linux).

        Returns:
            The file's path inside the runtime.
        """
        path = f"{runtime.home}/{INSTRUCTION_FILE}"
        await runtime.upload(path, ctx.instruction.encode("utf-8"))
        return path
