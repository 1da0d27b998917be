"""The ``shell`` harness: a command template run by ``/bin/sh -c``.

Placeholders, each replaced by its shell-quoted value (``shlex.quote``: a plain URL or name is
left as it is, anything with spaces or quotes is single-quoted), so the template must not put
them inside quotes of its own:

- ``{instruction}``: the instruction;
- ``{instruction_file}``: a file inside the runtime holding the instruction (no size limit);
- ``{base_url}``: the session's OpenAI base URL;
- ``{api_key}``: the session key;
- ``{model}``: the model name;
- ``{workdir}``: the working folder inside the runtime.

Other braces (``${VAR}``, ``awk '{print}'``) are left alone: this is plain replacement of the
names above, not ``str.format``.
"""

from __future__ import annotations

import re
import shlex

from rolloutd.errors import HarnessError
from rolloutd.sandbox.harnesses.base import HarnessAdapter, HarnessCommand, HarnessContext
from rolloutd.sandbox.runtimes.base import Runtime

PLACEHOLDERS = ("instruction", "instruction_file", "base_url", "api_key", "model", "workdir")


def render_template(template: str, values: dict[str, str]) -> str:
    """Replace ``{name}`` placeholders by shell-quoted values.

    Args:
        template: the command template.
        values: placeholder name -> raw value; names not in the template are ignored.

    Returns:
        The command line.
    """
    if not values:
        return template
    # one pass, so a value that itself contains "{model}" is never substituted again
    pattern = re.compile("|".join(re.escape("{" + name + "}") for name in values))
    return pattern.sub(lambda m: shlex.quote(values[m.group(0)[1:-1]]), template)


class ShellHarness(HarnessAdapter):
    """Runs ``spec.command`` with the placeholders of the module docstring filled in.

    ``spec.args`` are appended, each shell-quoted.
    """

    type = "shell"

    async def prepare(self, runtime: Runtime, ctx: HarnessContext) -> HarnessCommand:
        """Fill in the template; see :meth:`HarnessAdapter.prepare`.

        Raises:
            HarnessError: ``spec.command`` is empty.
        """
        if not isinstance(self.spec.command, str) or not self.spec.command:
            raise HarnessError(
                "harness.command (one shell string) is required for the shell harness"
            )
        workdir = ctx.workdir or runtime.workdir
        values = {
            "instruction": ctx.instruction,
            "instruction_file": await self.write_instruction(runtime, ctx),
            "base_url": ctx.openai_base_url,
            "api_key": ctx.api_key,
            "model": ctx.model,
            "workdir": workdir,
        }
        command = render_template(self.spec.command, values)
        if self.spec.args:
            command += " " + shlex.join(self.spec.args)
        return HarnessCommand(command=command, env=self.session_env(runtime, ctx), cwd=workdir)
