"""Host-side settings of the sandbox fleet that runtimes and harness adapters read.

``ROLLOUTD_NPM_PREFIX`` names the npm prefix where harness CLIs are installed
(``npm install --prefix PREFIX @qwen-code/qwen-code``); bwrap runtimes bind it read-only at the
same path so ``node PREFIX/node_modules/...`` works inside the sandbox.
"""

from __future__ import annotations

import os
from pathlib import Path

from rolloutd.settings import default_cache

#: the environment variable naming the npm prefix of harness CLIs.
NPM_PREFIX_ENV = "ROLLOUTD_NPM_PREFIX"


def npm_prefix() -> Path:
    """The npm prefix of harness CLIs: ``$ROLLOUTD_NPM_PREFIX`` or ``{cache}/npm``.

    ``{cache}`` is ``$ROLLOUTD_CACHE`` or ``~/.cache/rolloutd``.

    Returns:
        An absolute path; it may not exist (nothing installed yet).
    """
    if env := os.environ.get(NPM_PREFIX_ENV):
        return Path(env).expanduser().absolute()
    return (default_cache() / "npm").absolute()
