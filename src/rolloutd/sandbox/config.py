"""Host-side paths of the sandbox fleet that runtimes and harness adapters read
(:class:`rolloutd.settings.HostSettings`).

``ROLLOUTD_NPM_PREFIX`` names the npm prefix where harness CLIs are installed
(``npm install --prefix PREFIX @qwen-code/qwen-code``); bwrap runtimes bind it read-only at the
same path so ``node PREFIX/node_modules/...`` works inside the sandbox.

``ROLLOUTD_TOOLS_DIR`` names the folder of the Python harness CLIs (mini-swe-agent, aider), each
in its own virtual environment ``{tools}/<package>`` made by ``uv tool install`` (scripts/setup.sh),
so their pins never meet rolloutd's; their entry points are in ``{tools}/bin``. bwrap binds the
folder read-only at the same path, and the base Python each environment links to
(:func:`tool_python_dirs`).
"""

from __future__ import annotations

from pathlib import Path

from rolloutd.settings import HostSettings, default_cache

#: the variable of :attr:`HostSettings.npm_prefix` (named in messages; tests set it).
NPM_PREFIX_ENV = "ROLLOUTD_NPM_PREFIX"
#: the variable of :attr:`HostSettings.tools_dir`.
TOOLS_DIR_ENV = "ROLLOUTD_TOOLS_DIR"


def npm_prefix() -> Path:
    """The npm prefix of harness CLIs: ``$ROLLOUTD_NPM_PREFIX`` or ``{cache}/npm``.

    ``{cache}`` is ``$ROLLOUTD_CACHE`` or ``~/.cache/rolloutd``.

    Returns:
        An absolute path; it may not exist (nothing installed yet).
    """
    if prefix := HostSettings().npm_prefix:
        return prefix.expanduser().absolute()
    return (default_cache() / "npm").absolute()


def tools_dir() -> Path:
    """The folder of Python harness CLIs: ``$ROLLOUTD_TOOLS_DIR`` or ``{cache}/tools``.

    Returns:
        An absolute path; it may not exist (nothing installed yet).
    """
    if tools := HostSettings().tools_dir:
        return tools.expanduser().absolute()
    return (default_cache() / "tools").absolute()


def tool_python_dirs(tools: Path | None = None) -> list[Path]:
    """The Python installations the tool environments under ``tools`` run on.

    A virtual environment's ``bin/python`` is a symlink to its base interpreter, named by the
    ``home`` key of its ``pyvenv.cfg`` (PEP 405); inside a sandbox that installation must be
    visible at the same path, or the CLI's shebang points nowhere.

    Args:
        tools: the tools folder; default :func:`tools_dir`.

    Returns:
        The base installations' prefixes (the parent of ``home``'s ``bin``), resolved, sorted,
        without duplicates; empty when nothing is installed.
    """
    tools = tools or tools_dir()
    prefixes: set[Path] = set()
    for cfg in tools.glob("*/pyvenv.cfg"):
        try:
            lines = cfg.read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                prefixes.add(Path(value.strip()).resolve().parent)
    return sorted(prefixes)
