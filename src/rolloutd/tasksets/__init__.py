"""External task sets as tasks: Harbor task folders (Terminal-Bench 2.0's format) and
SWE-bench, SWE-Gym and SWE-smith instances.

Each module reads its set's own files with the standard library, refuses by name what rolloutd
cannot run, and turns a row into a :class:`~rolloutd.types.TaskRequest` under the trainer's
:class:`~rolloutd.tasksets.options.TaskOptions`: ``harbor`` (:mod:`.harbor`, task.toml in
:mod:`.harbor_config`), ``swebench`` (:mod:`.swebench`). The buffer
(``TaskSource.type``), ``rolloutd generate`` (``source.type``) and ``rolloutd submit``
(``--harbor`` / ``--swebench``) read them through :func:`read_task_set`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from rolloutd.tasksets import harbor, swebench
from rolloutd.tasksets.options import TaskOptions
from rolloutd.tasksets.swebench import SwebenchOptions
from rolloutd.types import TaskRequest

__all__ = ["SwebenchOptions", "TaskOptions", "read_task_set", "row_task", "task_set_rows"]

#: the task-set kinds
TaskSetKind = Literal["harbor", "swebench"]


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
        options: :class:`TaskOptions` (harbor) or :class:`SwebenchOptions` (swebench) fields.
        path: the task set's path (a dataset's relative build contexts resolve against it).

    Raises:
        ConfigError: the row is not a task rolloutd can run (named).
        pydantic.ValidationError: malformed options, or a malformed resulting task.
    """
    if kind == "harbor":
        return harbor.task_request(harbor.load_task(row), TaskOptions.model_validate(options))
    return swebench.task_request(
        row, SwebenchOptions.model_validate(options), base=Path(path).expanduser().parent
    )


def read_task_set(
    kind: TaskSetKind, path: str | Path, options: dict[str, Any]
) -> list[TaskRequest]:
    """Every row of a task set as a task (:func:`task_set_rows`, :func:`row_task`).

    Raises:
        ConfigError, OSError, ValueError, pydantic.ValidationError: as those functions.
    """
    return [row_task(kind, row, options, path=path) for row in task_set_rows(kind, path)]
