"""Eval-fleet activities that do the trainer's I/O: read a buffer's task source in chunks, and
POST session results to a task's ``callback_url``.

Both run on ``rolloutd-eval``. Temporal owns retries: the HTTP client runs without retries,
and upstream statuses map to retryable / non-retryable ``ApplicationError`` in
:func:`_raise_for_status` (the shape of sdk-python ``contrib/openai_agents``'s
``_invoke_model_activity.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import structlog
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from rolloutd import tasksets
from rolloutd.activities.models import (
    PostCallbackInput,
    PostCallbackOutput,
    ReadTaskChunkInput,
    ReadTaskChunkOutput,
)
from rolloutd.errors import ConfigError
from rolloutd.fault import receiver_status_fault, transport_fault
from rolloutd.http_client import CALLBACK, new_async_client
from rolloutd.types import TaskRequest

log = structlog.get_logger(__name__)

#: TaskRequest fields that are objects: a Parquet column may hold them as JSON text.
_NESTED = ("runtime", "harness", "builder", "evaluator", "sampling", "phases", "metadata")


def _row_to_task(row: dict[str, Any]) -> TaskRequest:
    """A TaskRequest from one source row (a JSON object, or a Parquet row of columns).

    A Parquet row may carry the whole task as JSON text in a ``task`` column, or one column per
    field, nested fields as structs or as JSON text; null columns are left to their defaults.
    """
    if set(row) == {"task"} and isinstance(row["task"], str):
        row = json.loads(row["task"])
    fields = {k: v for k, v in row.items() if v is not None}
    for key in _NESTED:
        if isinstance(fields.get(key), str):
            fields[key] = json.loads(fields[key])
    return TaskRequest.model_validate(fields)


def read_rows(path: Path, fmt: str, offset: int, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """Rows ``[offset, offset + limit)`` of a task file, and whether the file ends there.

    JSONL rows are the non-blank lines that do not start with ``#`` (counted as rows either way:
    a blank line is skipped without moving the cursor).

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: an unknown format, or a JSONL line that is not JSON (named by row).
    """
    if fmt == "jsonl":
        rows: list[dict[str, Any]] = []
        index = 0
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                if index >= offset + limit:
                    return rows, False
                if index >= offset:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"row {index}: not JSON: {e}") from None
                index += 1
        return rows, True
    if fmt == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        chunk = table.slice(offset, limit).to_pylist()
        return chunk, offset + len(chunk) >= table.num_rows
    raise ValueError(f"unknown task source format {fmt!r}; jsonl or parquet")


def _raise_for_status(response: httpx.Response, attempt: int) -> None:
    """Map an HTTP status to Temporal's retry decision: 2xx passes; the infrastructure's
    failures (:func:`rolloutd.fault.receiver_status_fault`: 5xx, and 408, 409, 425, 429 from
    a busy receiver) are retried; any other 4xx is final (the receiver refuses the body). The
    error's details hold ``attempt`` (the workflow reports it)."""
    code = response.status_code
    if 200 <= code < 300:
        return
    raise ApplicationError(
        f"callback answered {code}",
        attempt,
        type="CallbackHTTPError",
        non_retryable=not receiver_status_fault(code).retryable,
    )


class TrainerIOActivities:
    """The eval fleet's trainer-facing I/O; owns one HTTP client.

    Args:
        timeout_s: limit of one callback POST.
    """

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.http = new_async_client(CALLBACK, timeout_s=timeout_s)

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.http.aclose()

    @activity.defn(name="read_task_chunk")
    async def read_task_chunk(self, input: ReadTaskChunkInput) -> ReadTaskChunkOutput:
        """Read up to ``limit`` tasks from the cursor ``offset`` of a JSONL / Parquet file, or
        of a task set (``harbor``, ``swebench``: :mod:`rolloutd.tasksets`).

        Invalid rows do not stop the source: each is reported in ``errors`` and skipped.

        Raises:
            ApplicationError: non-retryable when the file is missing or unreadable.
        """
        task_set = input.format in ("harbor", "swebench")
        try:
            if task_set:
                every = tasksets.task_set_rows(input.format, input.path)  # type: ignore[arg-type]
                rows = every[input.offset : input.offset + input.limit]
                exhausted = input.offset + len(rows) >= len(every)
            else:
                rows, exhausted = read_rows(
                    Path(input.path).expanduser(), input.format, input.offset, input.limit
                )
        except (OSError, ValueError, ConfigError) as e:
            raise ApplicationError(str(e), type="TaskSourceError", non_retryable=True) from e
        tasks: list[TaskRequest] = []
        errors: list[str] = []
        for i, row in enumerate(rows):
            try:
                if task_set:
                    task = tasksets.row_task(
                        input.format,  # type: ignore[arg-type]
                        row,
                        input.options,
                        path=input.path,
                    )
                    tasks.append(task)
                else:
                    tasks.append(_row_to_task(row))
            except (ValidationError, ValueError, TypeError, ConfigError) as e:
                errors.append(f"row {input.offset + i}: {e}")
        if errors:
            log.warning("task_source_rows_invalid", path=input.path, num_invalid=len(errors))
        return ReadTaskChunkOutput(
            tasks=tasks, errors=errors, next_offset=input.offset + len(rows), exhausted=exhausted
        )

    @activity.defn(name="post_callback")
    async def post_callback(self, input: PostCallbackInput) -> PostCallbackOutput:
        """POST one SessionResult (JSON) to a task's ``callback_url``.

        Returns:
            The receiver's status code and this attempt's number (1-based).

        Raises:
            ApplicationError: retryable on connection errors, 5xx, 408/409/425/429;
                non-retryable on other 4xx; its details hold the attempt's number.
        """
        attempt = activity.info().attempt
        structlog.contextvars.bind_contextvars(
            session_id=input.session.session_id, task_id=input.session.task_id, attempt=attempt
        )
        try:
            response = await self.http.post(input.url, json=input.session.model_dump(mode="json"))
        except httpx.HTTPError as e:
            raise ApplicationError(
                f"callback failed: {type(e).__name__}: {e}",
                attempt,
                type="CallbackHTTPError",
                non_retryable=not transport_fault(e).retryable,
            ) from e
        _raise_for_status(response, attempt)
        log.info("callback_posted", status_code=response.status_code)
        return PostCallbackOutput(status_code=response.status_code, attempt=attempt)
