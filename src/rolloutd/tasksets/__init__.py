"""External task sets as tasks: Harbor task folders (Terminal-Bench 2.0's format) and
SWE-bench, SWE-Gym and SWE-smith instances.

Each module reads its set's own files with the standard library, refuses by name what rolloutd
cannot run, and turns a row into a :class:`~rolloutd.types.TaskRequest` under the trainer's
:class:`~rolloutd.tasksets.options.TaskOptions` (``HarborOptions``, ``SwebenchOptions``):
``harbor`` (:mod:`.harbor`, task.toml in
:mod:`.harbor_config`), ``swebench`` (:mod:`.swebench`). The buffer
(``TaskSource.type``), ``rolloutd generate`` (``source.type``) and ``rolloutd submit``
(``--harbor`` / ``--swebench``) read them through :func:`read_task_set`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from rolloutd.payload import validate_strict
from rolloutd.tasksets import harbor, swebench
from rolloutd.tasksets.harbor import HarborOptions
from rolloutd.tasksets.options import TaskOptions
from rolloutd.tasksets.swebench import SwebenchOptions
from rolloutd.types import TaskRequest

__all__ = [
    "HarborOptions",
    "SwebenchOptions",
    "TaskOptions",
    "read_task_set",
    "row_task",
    "task_options",
    "task_set_rows",
]

#: the task-set kinds
TaskSetKind = Literal["harbor", "swebench"]


def task_options(
    kind: TaskSetKind, options: Mapping[str, Any], *, strict: bool = False
) -> TaskOptions:
    """The trainer's options of a task set: :class:`HarborOptions` (harbor) or
    :class:`SwebenchOptions` (swebench).

    Args:
        kind: the task set's kind.
        options: the fields as written.
        strict: refuse unknown fields by name (:func:`rolloutd.payload.validate_strict`):
            where a person or a trainer wrote them (``rolloutd submit --harbor``, a buffer's
            source when the buffer starts). Workers read options already checked, leniently,
            so a worker of an earlier build runs a task a later client wrote.

    Raises:
        pydantic.ValidationError: malformed options (and, with ``strict``, an unknown field
            with the nearest known name).
    """
    model = HarborOptions if kind == "harbor" else SwebenchOptions
    return validate_strict(model, dict(options)) if strict else model.model_validate(options)


def task_set_rows(kind: TaskSetKind, path: str | Path) -> list[Any]:
    """The rows of a task set, in order: task folders (harbor), or instance rows (swebench, a
    JSONL file; a Parquet file needs ``pyarrow``).

    Raises:
        ConfigError: no task folder under a harbor ``path``.
        OSError: the file cannot be read.
        ValueError: a JSONL line is not JSON.
    """
    if kind == "harbor":
        return harbor.find_tasks(path)
    file = Path(path).expanduser()
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq  # optional extra: rolloutd[parquet]

        return pq.read_table(file).to_pylist()
    import json

    rows = []
    for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{file}:{n}: not JSON: {e}") from None
    return rows


def row_task(
    kind: TaskSetKind, row: Any, options: dict[str, Any], *, path: str | Path
) -> TaskRequest:
    """One row of a task set as a task.

    Args:
        kind: ``harbor`` (``row`` is a task folder) or ``swebench`` (``row`` is a dict).
        row: from :func:`task_set_rows`.
        options: :class:`HarborOptions` (harbor) or :class:`SwebenchOptions` (swebench) fields.
        path: the task set's path (a dataset's relative build contexts resolve against it).

    Raises:
        ConfigError: the row is not a task rolloutd can run (named).
        pydantic.ValidationError: malformed options, or a malformed resulting task.
    """
    chosen = task_options(kind, options)
    if kind == "harbor":
        return harbor.task_request(harbor.load_task(row), chosen)  # type: ignore[arg-type]
    return swebench.task_request(
        row,
        chosen,  # type: ignore[arg-type]  # SwebenchOptions for swebench
        base=Path(path).expanduser().parent,
    )


def read_task_set(
    kind: TaskSetKind, path: str | Path, options: dict[str, Any]
) -> list[TaskRequest]:
    """Every row of a task set as a task (:func:`task_set_rows`, :func:`row_task`), the options
    checked strictly first (they are what the caller wrote).

    Raises:
        ConfigError, OSError, ValueError, pydantic.ValidationError: as those functions.
    """
    task_options(kind, options, strict=True)
    return [row_task(kind, row, options, path=path) for row in task_set_rows(kind, path)]
