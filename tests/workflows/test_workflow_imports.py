"""Every workflow module imports its activities and models inside
``workflow.unsafe.imports_passed_through()`` and never pulls in an I/O library: importing
each one in a fresh interpreter loads none of httpx, transformers, spython or fsspec
(Temporal's workflow sandbox re-imports workflow modules on every run; docs.temporal.io,
"Python SDK sandbox")."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import rolloutd.workflows

#: libraries a workflow module must not import (I/O, heavy, or not deterministic)
FORBIDDEN = ("httpx", "transformers", "spython", "fsspec")
MODULES = sorted(
    m.name for m in pkgutil.walk_packages(rolloutd.workflows.__path__, "rolloutd.workflows.")
)


def test_the_workflow_modules_are_found() -> None:
    assert "rolloutd.workflows.session.workflow" in MODULES
    assert "rolloutd.workflows.buffer.workflow" in MODULES
    assert "rolloutd.workflows.generation.workflow" in MODULES


@pytest.mark.parametrize("module", MODULES)
def test_a_workflow_module_imports_no_io_library(module: str) -> None:
    script = f"import sys, {module}; print(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"
