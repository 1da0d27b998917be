"""The import contracts (pyproject.toml, ``[tool.importlinter]``) hold, and they bite.

``lint-imports`` runs in a child process over this checkout's ``src/`` (not whatever rolloutd
the environment installed), as .ci/run runs it. The second test breaks a copy of the package
in each way a contract forbids, with the import inside a function (the contracts count those
too), and checks that ``lint-imports`` refuses the copy and names the import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the console script of the environment running the tests (the one .ci/run calls)
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(src: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``lint-imports`` with this checkout's contracts over the package under ``src``.

    Returns:
        The finished process: exit code 0 when every contract is kept, 1 when one is broken;
        its report in ``stdout``.
    """
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_import_contracts_hold(tmp_path):
    result = lint_imports(ROOT / "src", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "8 kept, 0 broken" in result.stdout, result.stdout


#: (module changed, import added inside a function, contract broken, line of the report)
BREAKS = {
    "lower layer imports a higher one": (
        "errors.py",
        "rolloutd.cli",
        "rolloutd's layers",
        "rolloutd.errors -> rolloutd.cli",
    ),
    "cycle between siblings": (
        "proxy/sessions/state.py",
        "rolloutd.proxy.sessions.recorder",
        "no import cycle",
        "No cycles are allowed in rolloutd.proxy",
    ),
    "the call path runs back up": (
        "proxy/render/messages.py",
        "rolloutd.proxy.calls.service",
        "the gateway's call path",
        "rolloutd.proxy.render.messages -> rolloutd.proxy.calls.service",
    ),
    "gateway imports the runtimes": (
        "proxy/core/request_identity.py",
        "rolloutd.sandbox.artifacts",
        "do not import each other",
        "rolloutd.proxy.core.request_identity -> rolloutd.sandbox.artifacts",
    ),
    "the core imports a trainer package": (
        "trainer_client/training/exports.py",
        "trl",
        "only the trainer bridges import a trainer package",
        "rolloutd.trainer_client.training.exports -> trl",
    ),
    "the client side imports the training side": (
        "trainer_client/buffer.py",
        "rolloutd.trainer_client.training.grpo",
        "client side imports nothing of its training side",
        "rolloutd.trainer_client.buffer -> rolloutd.trainer_client.training.grpo",
    ),
    "the client's face imports torch": (
        "trainer_client/__init__.py",
        "torch",
        "client side imports nothing of its training side",
        "rolloutd.trainer_client -> torch",
    ),
    "a command runs back up to the entry point": (
        "cli/report.py",
        "rolloutd.cli.entry",
        "the command line",
        "rolloutd.cli.report -> rolloutd.cli.entry",
    ),
    "the client imports a server package": (
        "trainer_client/rest_client.py",
        "fastapi",
        "the client install",
        "rolloutd.trainer_client.rest_client -> fastapi",
    ),
    "TRL's rollout function imports transformers": (
        "trainer_client/bridges/trl.py",
        "transformers",
        "the client install",
        "rolloutd.trainer_client.bridges.trl -> transformers",
    ),
    "the client reaches the gateway": (
        "trainer_client/tenants.py",
        "rolloutd.proxy.core.fastjson",
        "the client install",
        "rolloutd.trainer_client.tenants -> rolloutd.proxy.core.fastjson",
    ),
    "one bridge imports another's trainer": (
        "trainer_client/bridges/trl.py",
        "verl",
        "only the trainer bridges import a trainer package",
        "rolloutd.trainer_client.bridges.trl -> verl",
    ),
}


@pytest.mark.parametrize("case", BREAKS)
def test_a_forbidden_import_breaks_its_contract(case, tmp_path):
    module, imported, contract, report = BREAKS[case]
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "src" / "rolloutd", src / "rolloutd", ignore=shutil.ignore_patterns("__pycache__")
    )
    with (src / "rolloutd" / module).open("a", encoding="utf-8") as f:
        f.write(f"\n\ndef _forbidden() -> None:\n    import {imported}  # noqa: F401\n")
    result = lint_imports(src, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    # errors -> cli also closes cycles (cli imports errors), so other contracts may break too
    # a contract with ignored imports reports "BROKEN (n ignored imports)"
    broken = [line for line in result.stdout.splitlines() if " BROKEN" in line]
    assert any(contract in line for line in broken), result.stdout
    assert report in result.stdout, result.stdout


def test_the_client_side_contract_names_every_client_module():
    """The contract that keeps the trainer client's client side off its training side lists
    its source modules one by one (so the package's face counts as itself): a new module of
    rolloutd.trainer_client outside training/ and bridges/ must be on that list, and on the
    client install's with the TRL rollout function's."""
    import pkgutil
    import tomllib

    import rolloutd.trainer_client as client_side

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    listed = next(c for c in contracts["contracts"] if c["id"] == "client-side")
    modules = {
        f"rolloutd.trainer_client.{m.name}"
        for m in pkgutil.iter_modules(client_side.__path__)
        if m.name not in ("training", "bridges")
    }
    assert set(listed["source_modules"]) == {"rolloutd.trainer_client", *modules}
    install = next(c for c in contracts["contracts"] if c["id"] == "client-install")
    assert set(install["source_modules"]) == {
        *listed["source_modules"],
        "rolloutd.trainer_client.bridges.common",
        "rolloutd.trainer_client.bridges.trl",
    }


def test_a_process_that_submits_loads_no_training_code():
    """Importing the trainer client (what a process that only submits and reads needs), its
    tracker logger included, loads neither its training side nor torch, numpy or gguf, nor a
    tracker's package (each is imported when its tracker opens)."""
    code = (
        "import sys, rolloutd.trainer_client, rolloutd.trainer_client.tracking\n"
        "print(sorted(m for m in ('torch', 'numpy', 'gguf', 'rolloutd.trainer_client.training',"
        " 'rolloutd.trainer_client.bridges', 'tensorboard', 'wandb', 'mlflow')"
        " if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
