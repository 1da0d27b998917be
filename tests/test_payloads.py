"""The payload models: one base (``rolloutd.payload.Payload``) that ignores unknown fields,
and one way to document a field, ``Field(description=...)`` (no ``#:`` comments above fields,
no ``Attributes:`` section in a payload's docstring)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rolloutd
from rolloutd.activities.models import OpenSessionInput
from rolloutd.payload import Payload
from rolloutd.types import SessionResult, TaskRequest
from rolloutd.workflows.buffer.models import BufferConfig
from rolloutd.workflows.session.models import SessionInput

SRC = Path(rolloutd.__file__).parent


def payload_classes() -> list[tuple[Path, ast.ClassDef]]:
    """Classes of ``src/rolloutd`` that name ``Payload`` as a base, with their file."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                ast.unparse(b) == "Payload" for b in node.bases
            ):
                found.append((path, node))
    return found


def test_the_payload_classes_are_found() -> None:
    names = {node.name for _, node in payload_classes()}
    assert {"TaskRequest", "SessionResult", "OpenSessionInput", "BufferConfig"} <= names


@pytest.mark.parametrize(
    "model", [TaskRequest, SessionResult, OpenSessionInput, BufferConfig, SessionInput]
)
def test_every_payload_model_shares_the_one_base(model: type) -> None:
    assert issubclass(model, Payload)


def test_every_persisted_record_shares_the_one_base() -> None:
    """What the gateway and the stack write to the store or to disk, and read back after a
    restart (possibly written by another release), is a payload too."""
    from rolloutd.proxy.backends.specs import BackendSpec, PoolState
    from rolloutd.proxy.sessions.call_errors import CallError
    from rolloutd.proxy.sessions.state import BackendMove, SessionState
    from rolloutd.stack.state import ChildState, EngineState, StackState

    records = [
        SessionState,
        BackendMove,
        CallError,
        PoolState,
        BackendSpec,
        StackState,
        ChildState,
        EngineState,
    ]
    assert [r.__name__ for r in records if not issubclass(r, Payload)] == []
    spec = BackendSpec.model_validate({"name": "a", "url": "http://x", "added_later": 1})
    assert "added_later" not in spec.model_dump()


def test_an_unknown_field_is_ignored_so_old_and_new_workers_interoperate() -> None:
    task = TaskRequest.model_validate(
        {
            "task_id": "t",
            "instruction": "x",
            "harness": {"type": "shell", "command": "true", "added_later": 1},
            "added_later": {"a": 1},
        }
    )
    assert task.task_id == "t" and "added_later" not in task.model_dump()
    assert "added_later" not in task.harness.model_dump()


def test_payload_fields_are_documented_with_field_descriptions_only() -> None:
    offenders = []
    for path, node in payload_classes():
        lines = path.read_text().split("\n")
        doc = ast.get_docstring(node) or ""
        if "Attributes:" in doc:
            offenders.append(f"{path.name}:{node.lineno} {node.name}: an Attributes: section")
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and lines[stmt.lineno - 2].strip().startswith("#:"):
                offenders.append(f"{path.name}:{stmt.lineno} {node.name}: a #: comment")
    assert offenders == []


def test_a_drop_reason_a_newer_buffer_added_is_read_as_it_is() -> None:
    """A buffer's dropped groups travel in its continue-as-new state and in its stats: a
    reader that predates a reason keeps it instead of refusing the whole state."""
    from rolloutd.workflows.buffer.models import DROP_REASONS, BufferState

    state = BufferState.model_validate(
        {
            "dropped": [
                {"task_id": "t", "reason": "added_later"},
                {"task_id": "u", "reason": "stale"},
            ]
        }
    )
    assert [d.reason for d in state.dropped] == ["added_later", "stale"]
    assert "mixed_logprob_modes" in DROP_REASONS and "added_later" not in DROP_REASONS
