"""Stand-in harness CLIs for the adapters' unit tests: an npm package under a fresh npm
prefix, or a Python tool's entry point under a fresh tools folder, each named by its
``ROLLOUTD_*`` variable for the test's duration. The adapters read only what these write (an
entry file, ``package.json``'s version), so the real CLIs are not needed here; the real ones
run in ``acceptance/``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from rolloutd.sandbox.config import NPM_PREFIX_ENV, TOOLS_DIR_ENV


@pytest.fixture
def npm_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """``make(package, entry, text, *, package_json=None, executable=False)``: write ``text``
    as ``{prefix}/node_modules/{package}/{entry}`` (``{prefix}/{entry}`` when ``package`` is
    None) and ``package_json`` as the package's ``package.json``; returns the prefix, which
    ``ROLLOUTD_NPM_PREFIX`` names."""
    prefix = tmp_path / "npm"

    def make(
        package: str | None,
        entry: str,
        text: str,
        *,
        package_json: dict[str, str] | None = None,
        executable: bool = False,
    ) -> Path:
        folder = prefix / "node_modules" / package if package else prefix
        (folder / entry).parent.mkdir(parents=True, exist_ok=True)
        (folder / entry).write_text(text)
        if executable:
            (folder / entry).chmod(0o755)
        if package_json is not None:
            (folder / "package.json").write_text(json.dumps(package_json))
        monkeypatch.setenv(NPM_PREFIX_ENV, str(prefix))
        return prefix

    return make


@pytest.fixture
def tool_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], Path]:
    """``make(name, script)``: an executable ``{tools}/bin/{name}`` running ``script``;
    returns the tools folder, which ``ROLLOUTD_TOOLS_DIR`` names."""
    tools = tmp_path / "tools"

    def make(name: str, script: str) -> Path:
        (tools / "bin").mkdir(parents=True, exist_ok=True)
        (tools / "bin" / name).write_text(script)
        (tools / "bin" / name).chmod(0o755)
        monkeypatch.setenv(TOOLS_DIR_ENV, str(tools))
        return tools

    return make


@pytest.fixture
def fake_prefix(request: pytest.FixtureRequest, npm_package: Callable[..., Path]) -> Path:
    """The test module's stand-in CLI, its ``STAND_IN = (package, entry, text, package_json)``,
    installed with :func:`npm_package`; returns the npm prefix."""
    package, entry, text, package_json = request.module.STAND_IN
    return npm_package(package, entry, text, package_json=package_json)
