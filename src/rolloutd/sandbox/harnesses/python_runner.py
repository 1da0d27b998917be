"""Runs a coroutine agent inside a runtime, with an OpenAI client bound to its session.

This file is copied into the runtime (``$HOME/.rolloutd/python_runner.py``) and run there by an
interpreter that has the ``openai`` SDK; it imports nothing of rolloutd (the sandbox does not
see rolloutd's sources), only the standard library and ``openai``::

    python -u python_runner.py module:function

The agent contract (the verl AgentLoop / AReaL style: the trainer's code is an async function
that talks to an OpenAI-compatible server)::

    async def agent(client: openai.AsyncOpenAI, instruction: str, workdir: str, *,
                    model: str, max_turns: int) -> str | None

``model`` and ``max_turns`` are passed only when the function declares them (or ``**kwargs``).
``client`` is bound to the session (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``) with the SDK's own
retries off: the gateway answers a retried request from its log, and the agent sees an error
as it is. The module is imported with the workdir, then ``$HOME`` (where ``harness.files`` are
written), then ``PYTHONPATH`` on ``sys.path``.

Output: the agent's own output on stdout and stderr, then one line
``{"python_agent": {"ok": bool, "result": str, "error": str, "error_type": str}}`` on stdout;
exit code 0 when the coroutine returned, 1 when it raised, 2 when it could not be loaded.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
import traceback
from typing import Any

#: the line that carries the outcome; the adapter's summary looks for it.
SUMMARY_KEY = "python_agent"


def report(ok: bool, result: Any = None, error: BaseException | None = None) -> None:
    """Print the outcome line (module docstring)."""
    print(
        json.dumps(
            {
                SUMMARY_KEY: {
                    "ok": ok,
                    "result": "" if result is None else str(result)[:1000],
                    "error": "" if error is None else str(error)[:1000],
                    "error_type": "" if error is None else type(error).__name__,
                }
            }
        ),
        flush=True,
    )


def load(entry: str, search: list[str]) -> Any:
    """Import ``module:function`` with ``search`` in front of ``sys.path``."""
    module_name, _, function_name = entry.partition(":")
    for folder in reversed(search):
        if folder and folder not in sys.path:
            sys.path.insert(0, folder)
    function = getattr(importlib.import_module(module_name), function_name)
    if not inspect.iscoroutinefunction(function):
        raise TypeError(f"{entry} is not an async function")
    return function


async def run(function: Any, instruction: str, workdir: str, model: str, max_turns: int) -> Any:
    """Call the agent with a session-bound client; the client is closed afterwards."""
    # imported here, not at the top: the worker imports this module (for its file and
    # SUMMARY_KEY) without needing the SDK; main() checks it before the agent is loaded
    import openai

    params = inspect.signature(function).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    extra = {
        k: v
        for k, v in {"model": model, "max_turns": max_turns}.items()
        if takes_all or k in params
    }
    async with openai.AsyncOpenAI(
        base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0
    ) as client:
        return await function(client, instruction, workdir, **extra)


def main(argv: list[str]) -> int:
    """Entry point: ``python_runner.py module:function``; see the module docstring."""
    if len(argv) != 2:
        print("usage: python_runner.py module:function", file=sys.stderr)
        return 2
    workdir = os.environ.get("ROLLOUTD_WORKDIR") or os.getcwd()
    try:
        import openai  # noqa: F401 - a missing SDK is reported on the outcome line

        with open(os.environ["ROLLOUTD_INSTRUCTION_FILE"], encoding="utf-8") as f:
            instruction = f.read()
        function = load(argv[1], [workdir, os.path.expanduser("~")])
    except Exception as exc:  # noqa: BLE001 - process boundary: report what could not load
        traceback.print_exc()
        report(False, error=exc)
        return 2
    try:
        result = asyncio.run(
            run(
                function,
                instruction,
                workdir,
                os.environ.get("OPENAI_MODEL", ""),
                int(os.environ.get("ROLLOUTD_MAX_TURNS", "10")),
            )
        )
    except Exception as exc:  # noqa: BLE001 - process boundary: the agent failed, exit 1
        traceback.print_exc()
        report(False, error=exc)
        return 1
    report(True, result=result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
