"""Where harness CLIs are installed on a sandbox host.

npm CLIs live under one prefix (``npm install --prefix $ROLLOUTD_NPM_PREFIX PACKAGE``,
scripts/setup.sh), which bwrap binds read-only at the same path, so a runtime runs the host's
CLI with the runtime's ``node``; nothing is installed per session. Python CLIs live each in its
own environment under the tools folder (``$ROLLOUTD_TOOLS_DIR``), bound read-only the same way.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from rolloutd.errors import HarnessError
from rolloutd.sandbox.config import NPM_PREFIX_ENV, TOOLS_DIR_ENV, npm_prefix, tools_dir


def npm_cli(harness: str, package: str, entry: str, prefix: Path | None = None) -> Path:
    """Path of an npm CLI's entry point.

    Args:
        harness: the harness type, for the error message.
        package: the npm package, e.g. ``@openai/codex``.
        entry: the entry point below the package's folder, e.g. ``bin/codex.js``.
        prefix: npm prefix; default :func:`~rolloutd.sandbox.config.npm_prefix`.

    Raises:
        HarnessError: the package is not installed there; the message names the command that
            installs it.
    """
    prefix = prefix or npm_prefix()
    cli = prefix / "node_modules" / package / entry
    if not cli.is_file():
        raise HarnessError(
            f"{harness} harness: {cli} not found; install it with `bash scripts/setup.sh` "
            f"(or `npm install --prefix {prefix} {package}`) or set {NPM_PREFIX_ENV}"
        )
    return cli


def npm_version(harness: str, package: str, prefix: Path | None = None) -> str:
    """The version of an npm package installed under ``prefix`` (its ``package.json``).

    Raises:
        HarnessError: the package is not installed there, or its ``package.json`` is unreadable.
    """
    package_json = npm_cli(harness, package, "package.json", prefix)
    try:
        return str(json.loads(package_json.read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError) as e:
        raise HarnessError(f"{harness} harness: cannot read {package_json}: {e}") from e


def tool_cli(harness: str, package: str, entry: str, tools: Path | None = None) -> Path:
    """Path of a Python harness CLI's entry point in the tools folder.

    Each CLI lives in its own environment ``{tools}/{package}`` with its entry points in
    ``{tools}/bin`` (``uv tool install``, scripts/setup.sh).

    Args:
        harness: the harness type, for the error message.
        package: the PyPI distribution, e.g. ``aider-chat``.
        entry: the entry point's name, e.g. ``aider``.
        tools: the tools folder; default :func:`~rolloutd.sandbox.config.tools_dir`.

    Raises:
        HarnessError: the entry point is not there; the message names the setup step.
    """
    tools = tools or tools_dir()
    cli = tools / "bin" / entry
    if not cli.is_file():
        raise HarnessError(
            f"{harness} harness: {cli} not found; install it with `bash scripts/setup.sh` (or "
            f"`UV_TOOL_DIR={tools} UV_TOOL_BIN_DIR={tools}/bin uv tool install {package}`) or "
            f"set {TOOLS_DIR_ENV}"
        )
    return cli


def tool_version(harness: str, package: str, tools: Path | None = None) -> str:
    """The version of ``package`` installed in its own environment under the tools folder.

    Read from the name of its ``*.dist-info`` folder (the wheel spec: ``{name}-{version}``,
    name normalised to underscores).

    Raises:
        HarnessError: the package is not installed there.
    """
    tools = tools or tools_dir()
    name = re.sub(r"[-_.]+", "_", package).lower()
    for info in (tools / package).glob(f"lib/python*/site-packages/{name}-*.dist-info"):
        return info.name[len(name) + 1 : -len(".dist-info")]
    raise HarnessError(
        f"{harness} harness: {package} is not installed in {tools / package}; "
        f"install it with `bash scripts/setup.sh` or set {TOOLS_DIR_ENV}"
    )
