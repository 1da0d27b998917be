"""The ``cli`` harness: any command-line agent, declared in the task's JSON, no code.

A :class:`CliRecipe` says what to run (a shell string or an argv list), which provider dialect
it speaks, which environment it needs and which files (its own config) to write into the
runtime first. The ``cli`` harness takes the recipe from the task (``harness.command``,
``harness.dialect``, ``harness.env``, ``harness.files``, ``harness.args``); the built-in
adapters (codex, claude_code, ...) are :class:`CliHarness` subclasses that build the recipe in
code (POLAR's agent presets are recipes of this kind). Example task::

    {"harness": {"type": "cli", "dialect": "chat",
                 "command": ["my-agent", "--base-url", "{base_url}", "--task-file",
                             "{instruction_file}"],
                 "files": {".my-agent/config.json": "{\\"model\\": \\"{model}\\"}"}}}

Placeholders, replaced by plain substitution of the names below only (other braces, such as
JSON objects or ``${VAR}``, stay as written):

- ``{base_url}``: the session's URL for ``dialect`` (``chat``/``responses``: the OpenAI base URL
  ending in ``/v1``; ``anthropic``, ``gemini``: the session root their SDKs append paths to);
- ``{openai_base_url}``, ``{anthropic_base_url}``, ``{gemini_base_url}``: each dialect's URL;
- ``{api_key}``: the session key (prefer the provider variables every harness gets in its
  environment, e.g. ``OPENAI_API_KEY``: argv is visible to other processes of the runtime);
- ``{model}``, ``{instruction}``, ``{instruction_file}`` (the instruction in a file inside the
  runtime), ``{workdir}``, ``{home}``, ``{max_turns}``.

How a value is written depends on where the placeholder sits: in a shell-string command it is
shell-quoted (``shlex.quote``: do not put it inside quotes of your own); in an argv element, an
environment value or a file it is written as is, except in files named ``*.json`` or ``*.toml``,
where it is escaped for the inside of a double-quoted string (put the quotes in the template).
"""

from __future__ import annotations

import json
import re
import shlex
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from rolloutd.errors import HarnessError
from rolloutd.sandbox.harnesses.base import HarnessAdapter, HarnessCommand, HarnessContext
from rolloutd.sandbox.harnesses.installed import npm_version
from rolloutd.sandbox.runtimes.base import Runtime

Dialect = Literal["chat", "responses", "anthropic", "gemini"]

PLACEHOLDERS = (
    "base_url",
    "openai_base_url",
    "anthropic_base_url",
    "gemini_base_url",
    "api_key",
    "model",
    "instruction",
    "instruction_file",
    "workdir",
    "home",
    "max_turns",
)


class CliRecipe(BaseModel):
    """What a command-line harness needs, with placeholders (module docstring) not yet filled.

    Attributes:
        command: a shell string (run by ``/bin/sh -c``) or an argv list.
        dialect: the provider API the CLI speaks; picks ``{base_url}``.
        env: environment on top of the provider variables every harness gets.
        files: path -> content; a relative path is under the runtime's HOME.
        cwd: working folder inside the runtime; None: the runtime's workdir.
    """

    model_config = ConfigDict(extra="forbid")

    command: str | list[str]
    dialect: Dialect = "chat"
    env: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None


def render(template: str, values: dict[str, str], quote: str = "raw") -> str:
    """Replace the ``{name}`` placeholders of ``values`` in ``template``, in one pass.

    Args:
        template: text with placeholders.
        values: placeholder name -> raw value.
        quote: ``raw`` (as is), ``shell`` (``shlex.quote``) or ``json`` (escaped for the inside
            of a JSON or TOML double-quoted string).

    Returns:
        The filled-in text; a value that itself contains ``{model}`` is never substituted again.
    """
    if not values:
        return template
    escape = {"raw": lambda v: v, "shell": shlex.quote, "json": lambda v: json.dumps(v)[1:-1]}[
        quote
    ]
    pattern = re.compile("|".join(re.escape("{" + name + "}") for name in values))
    return pattern.sub(lambda m: escape(values[m.group(0)[1:-1]]), template)


def dialect_url(ctx: HarnessContext, dialect: Dialect) -> str:
    """The session's base URL for ``dialect``.

    Raises:
        HarnessError: the session has no URL for that dialect.
    """
    url = {
        "chat": ctx.openai_base_url,
        "responses": ctx.openai_base_url,
        "anthropic": ctx.anthropic_base_url,
        "gemini": ctx.gemini_base_url,
    }[dialect]
    if not url:
        raise HarnessError(f"the session has no {dialect} base URL")
    return url


class CliHarness(HarnessAdapter):
    """Runs a :class:`CliRecipe`: the task's own (``type: "cli"``) or a subclass's.

    Subclasses override :meth:`recipe` (and :meth:`cli_version` when they need a CLI installed
    on the host). ``spec.files`` and ``spec.env`` are applied on top of any recipe, and
    ``spec.args`` are appended to its command, so a task can adjust a built-in adapter.
    """

    type = "cli"
    #: the npm package of a subclass's CLI (installed under the npm prefix); None: no CLI of ours
    npm_package: ClassVar[str | None] = None

    @classmethod
    def cli_version(cls) -> str | None:
        """The installed version of ``npm_package``, or None when the harness needs no CLI.

        Raises:
            HarnessError: the package is not installed (the message names the setup step).
        """
        return npm_version(cls.type, cls.npm_package) if cls.npm_package else None

    async def recipe(self, runtime: Runtime, ctx: HarnessContext) -> CliRecipe:
        """The recipe to run; for ``cli``, the task's spec.

        Raises:
            HarnessError: the spec has no command.
        """
        if not self.spec.command:
            raise HarnessError("harness.command is required for the cli harness")
        return CliRecipe(command=self.spec.command, dialect=self.spec.dialect or "chat")

    def values(
        self, runtime: Runtime, ctx: HarnessContext, dialect: Dialect, instruction_file: str
    ) -> dict[str, str]:
        """Placeholder name -> value for this session (module docstring)."""
        return {
            "base_url": dialect_url(ctx, dialect),
            "openai_base_url": ctx.openai_base_url,
            "anthropic_base_url": ctx.anthropic_base_url or "",
            "gemini_base_url": ctx.gemini_base_url or "",
            "api_key": ctx.api_key,
            "model": ctx.model,
            "instruction": ctx.instruction,
            "instruction_file": instruction_file,
            "workdir": ctx.workdir or runtime.workdir,
            "home": runtime.home,
            "max_turns": str(self.spec.max_turns),
        }

    async def prepare(self, runtime: Runtime, ctx: HarnessContext) -> HarnessCommand:
        """Write the recipe's files and the instruction, and return the filled-in command.

        Raises:
            HarnessError: the recipe cannot be built (a CLI missing on this host, no command).
        """
        recipe = await self.recipe(runtime, ctx)
        values = self.values(
            runtime, ctx, recipe.dialect, await self.write_instruction(runtime, ctx)
        )
        for path, content in (recipe.files | self.spec.files).items():
            target = path if path.startswith("/") else f"{runtime.home}/{path}"
            quote = "json" if path.endswith((".json", ".toml")) else "raw"
            await runtime.upload(target, render(content, values, quote).encode("utf-8"))
        command: str | list[str]
        if isinstance(recipe.command, str):
            command = render(recipe.command, values, "shell")
            if self.spec.args:
                command += " " + shlex.join(self.spec.args)
        else:
            command = [render(a, values) for a in recipe.command] + list(self.spec.args)
        # provider variables, then the recipe's, then the task's own on top
        env = (
            self.session_env(runtime, ctx)
            | {k: render(v, values) for k, v in recipe.env.items()}
            | {k: render(v, values) for k, v in self.spec.env.items()}
        )
        return HarnessCommand(command=command, env=env, cwd=recipe.cwd or values["workdir"])
