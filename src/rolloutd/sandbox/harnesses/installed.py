"""Where harness CLIs are installed on a sandbox host.

npm CLIs live under one prefix (``npm install --prefix $ROLLOUTD_NPM_PREFIX PACKAGE``,
scripts/setup.sh), which bwrap binds read-only at the same path, so a runtime runs the host's
CLI with the runtime's ``node``; nothing is installed per session.
"""

from __future__ import annotations

import json
from pathlib import Path

from rolloutd.errors import HarnessError
from rolloutd.sandbox.config import NPM_PREFIX_ENV, npm_prefix


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
