"""What the Temporal UI says about a rollout: a static summary and details set when a task or
session workflow starts, and current details the workflow keeps up to date.

The summary is the one line the UI's workflow list shows (``static_summary`` of
``start_workflow`` / ``start_child_workflow``); the static details, the task's spec in short, are
on the detail page and in ``temporal workflow describe``. The current details (phase,
completions so far, reward at the end) are answered by the built-in
``__temporal_workflow_metadata`` query (``workflow.set_current_details``): the UI's detail page
and ``temporal workflow metadata`` show them while a worker runs. All three are Markdown-ish
plain text (Temporal API ``UserMetadata``; temporalio ``workflow.set_current_details``).

Pure functions of a :class:`~rolloutd.types.TaskRequest`: no I/O, safe in workflow code.
"""

from __future__ import annotations

from rolloutd.types import TaskRequest

#: the UI cuts a summary at about this many characters; keep the task id's head
MAX_SUMMARY_CHARS = 200


def _short(text: str, limit: int = MAX_SUMMARY_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def task_summary(task: TaskRequest) -> str:
    """The one-line summary of a task workflow: ``task sum-001 · 4 samples · qwen_code``."""
    samples = f"{task.num_samples} sample{'s' if task.num_samples != 1 else ''}"
    return _short(f"task {task.task_id} · {samples} · {task.harness.type}")


def task_memo(task: TaskRequest) -> dict[str, object]:
    """The memo of a task workflow, whoever starts it (a client or a buffer): read without a
    worker and without the history (``RolloutClient.status``, the REST facade's tenant
    check): ``num_samples``, ``callback`` (whether it has a callback URL), ``tenant``."""
    return {
        "num_samples": task.num_samples,
        "callback": task.callback_url is not None,
        "tenant": task.tenant,
    }


def session_summary(task: TaskRequest, sample_index: int) -> str:
    """The one-line summary of a session workflow: ``task sum-001 · sample 2 · qwen_code``.

    Args:
        task: the session's task.
        sample_index: its sample, 0-based (the ``i`` of ``task/{id}/{i}``).
    """
    return _short(f"task {task.task_id} · sample {sample_index} · {task.harness.type}")


def static_details(task: TaskRequest) -> str:
    """The task's spec in short, one ``key: value`` line each: harness, runtime, evaluator,
    builder, model, samples, deadline, and the first line of the instruction (cut at 200
    characters; the instruction is the user's text, the rest is configuration)."""
    instruction = task.instruction.strip().splitlines()[0] if task.instruction.strip() else ""
    lines = [
        f"task: {task.task_id}",
        f"harness: {task.harness.type}",
        f"runtime: {task.runtime.type}",
        f"evaluator: {task.evaluator.type}",
        f"builder: {task.builder.type}",
        f"model: {task.model or '(gateway default)'}",
        f"num_samples: {task.num_samples}",
        f"timeout_s: {task.timeout_s:g}",
        f"instruction: {_short(instruction)}",
    ]
    return "\n".join(lines)


def current_details(
    *,
    phase: str,
    num_completions: int | None = None,
    reward: float | None = None,
    status: str | None = None,
    failure: str | None = None,
    sessions: str | None = None,
) -> str:
    """A workflow's current details, one ``key: value`` line each (None leaves a line out).

    Args:
        phase: the session's phase (open, provision, run, collect, teardown, close, build,
            evaluate, done), or the task's (running, done, cancelled).
        num_completions: completions recorded so far (known for a session once its gateway
            session closed; for a task, summed over its ended sessions).
        reward: the reward at the end (None: not scored, docs/failures.md).
        status: the final status (completed, failed, timeout, cancelled).
        failure: the failure cause's kind, when there is one.
        sessions: for a task, its sessions so far, e.g. ``3/4 ended``.
    """
    lines = [f"phase: {phase}"]
    if sessions is not None:
        lines.append(f"sessions: {sessions}")
    if num_completions is not None:
        lines.append(f"completions: {num_completions}")
    if status is not None:
        lines.append(f"status: {status}")
    if failure is not None:
        lines.append(f"failure: {failure}")
    if status is not None or reward is not None:
        lines.append(f"reward: {'none' if reward is None else f'{reward:g}'}")
    return "\n".join(lines)
