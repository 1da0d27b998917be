"""Activities are named once (rolloutd.activities.names): defined and called by those names,
so a misspelt name fails when its module is imported, never later in a running workflow
(Temporal would only schedule an activity task that no worker takes)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest
from temporalio.activity import _Definition

import rolloutd
from rolloutd.activities import names

SRC = Path(rolloutd.__file__).parent
#: the workflow API's calls that name an activity first
CALLS = {"execute_activity", "execute_local_activity", "start_activity", "start_local_activity"}


def test_a_misspelt_activity_name_fails_at_import(tmp_path):
    """A copy of a real workflow module with one name misspelt does not import; the module as
    it is does."""
    source = (SRC / "workflows" / "callback.py").read_text()
    assert source.count("POST_CALLBACK") >= 2  # imported, then called
    good, bad = tmp_path / "callback_ok.py", tmp_path / "callback_typo.py"
    good.write_text(source)
    bad.write_text(source.replace("POST_CALLBACK", "POST_CALBACK"))

    def load(path: Path) -> None:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(importlib.util.module_from_spec(spec))

    load(good)
    with pytest.raises(ImportError, match="POST_CALBACK"):
        load(bad)


def test_every_activity_call_and_definition_names_the_registry():
    """No workflow calls an activity by a string literal, and no activity is defined with one:
    every name comes from the registry (or the call passes the activity function itself)."""
    literals = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "activities" / "names.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            named = []
            if called in CALLS and node.args:
                named.append(node.args[0])
            if called == "defn" and ast.unparse(func).startswith("activity."):
                named += [k.value for k in node.keywords if k.arg == "name"]
            literals += [
                f"{path.relative_to(SRC)}:{node.lineno} {ast.unparse(arg)}"
                for arg in named
                if isinstance(arg, ast.Constant)
            ]
    assert literals == []


def _defined_activity_names() -> set[str]:
    """The names of every activity defined in rolloutd's activity modules (and generation's)."""
    import rolloutd.activities as package

    modules = [f"rolloutd.activities.{m.name}" for m in pkgutil.iter_modules(package.__path__)]
    found: set[str] = set()
    for module_name in [*modules, "rolloutd.generation.activities"]:
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            candidates = [value, *vars(value).values()] if isinstance(value, type) else [value]
            for candidate in candidates:
                definition = _Definition.from_callable(candidate) if callable(candidate) else None
                if definition is not None and definition.name:
                    found.add(definition.name)
    return found


def test_the_registry_names_exactly_the_defined_activities():
    assert _defined_activity_names() == names.ALL
    assert len(names.ALL) == len(names.__all__) - 1  # each constant a name of its own
