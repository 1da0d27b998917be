"""Eval-fleet activities that do the trainer's I/O: read a buffer's task source in chunks, and
POST session results to a task's ``callback_url``.

Both run on ``rolloutd-eval``. Temporal owns retries: the HTTP client runs without retries,
and upstream statuses map to retryable / non-retryable ``ApplicationError`` in
:func:`_raise_for_status` (the shape of sdk-python ``contrib/openai_agents``'s
``_invoke_model_activity.py``).
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any, NamedTuple

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
from rolloutd.activities.names import POST_CALLBACK, READ_TASK_CHUNK
from rolloutd.errors import ConfigError
from rolloutd.fault import receiver_status_fault, transport_fault
from rolloutd.http_client import CALLBACK, new_async_client
from rolloutd.payload import validate_strict
from rolloutd.security.callbacks import SIGNATURE_HEADER, sign_callback
from rolloutd.types import TaskRequest

log = structlog.get_logger(__name__)

#: TaskRequest fields that are objects: a Parquet column may hold them as JSON text.
_NESTED = ("runtime", "harness", "builder", "evaluator", "sampling", "phases", "metadata")


class SourceRow(NamedTuple):
    """One row of a task source: where it is (``line 12`` of a JSONL file, 1-based; ``row 3``
    of a Parquet file, 0-based) and its value (None with ``error`` when the line is not JSON).
    """

    where: str
    value: Any
    error: str | None = None


def _row_to_task(row: Any) -> TaskRequest:
    """A TaskRequest from one source row (a JSON object, or a Parquet row of columns), checked
    strictly: an unknown field is refused by name (:func:`rolloutd.payload.validate_strict`).

    A Parquet row may carry the whole task as JSON text in a ``task`` column, or one column per
    field, nested fields as structs or as JSON text; null columns are left to their defaults.

    Raises:
        ValueError: the row is not a JSON object (``[1]``, ``"x"``), or a nested field's JSON
            text is not JSON.
        pydantic.ValidationError: a malformed or unknown field.
    """
    if isinstance(row, dict) and set(row) == {"task"} and isinstance(row["task"], str):
        row = json.loads(row["task"])
    if not isinstance(row, dict):
        raise ValueError(f"a task is a JSON object, not {type(row).__name__}: {row!r:.80}")
    fields = {k: v for k, v in row.items() if v is not None}
    for key in _NESTED:
        if isinstance(fields.get(key), str):
            fields[key] = json.loads(fields[key])
    return validate_strict(TaskRequest, fields)


def read_rows(path: Path, fmt: str, offset: int, limit: int) -> tuple[list[SourceRow], bool]:
    """Rows ``[offset, offset + limit)`` of a task file, and whether the file ends there.

    JSONL rows are the non-blank lines that do not start with ``#`` (a blank line is skipped
    without moving the cursor); a line that is not JSON is a row with its ``error``, so the
    caller skips it and counts it, and the rest of the file is read.

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: an unknown format.
    """
    if fmt == "jsonl":
        rows: list[SourceRow] = []
        index = 0
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                if index >= offset + limit:
                    return rows, False
                if index >= offset:
                    try:
                        rows.append(SourceRow(f"line {number}", json.loads(line)))
                    except json.JSONDecodeError as e:
                        rows.append(SourceRow(f"line {number}", None, f"not JSON: {e}"))
                index += 1
        return rows, True
    if fmt == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        chunk = table.slice(offset, limit).to_pylist()
        rows = [SourceRow(f"row {offset + i}", value) for i, value in enumerate(chunk)]
        return rows, offset + len(chunk) >= table.num_rows
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


#: the loopback hosts, as a pattern list an operator (or a test's own stack) may allow; never
#: allowed by default: a task's URL on the eval host's loopback reaches every service there
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def callback_host_allowed(url: str, allowed: tuple[str, ...] | list[str]) -> bool:
    """Whether ``url`` is an http(s) URL whose host (``host`` or ``host:port``) matches one of
    ``allowed`` (shell patterns, :func:`fnmatch.fnmatchcase`, compared in lower case)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return False
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return False
    host = parsed.host.lower()
    with_port = f"{host}:{parsed.port}" if parsed.port else host
    return any(
        fnmatch.fnmatchcase(host, p.lower()) or fnmatch.fnmatchcase(with_port, p.lower())
        for p in allowed
    )


class TrainerIOActivities:
    """The eval fleet's trainer-facing I/O; owns one HTTP client.

    Args:
        timeout_s: limit of one callback POST.
        allowed_hosts: host patterns a callback may reach (``EvalSettings
            .callback_allowed_hosts``; default none: every callback is refused until the
            operator lists the trainers' hosts): the eval host POSTs from inside the
            operator's network, so a task's URL must not reach its other services, loopback
            ones included (a server-side request forgery, OWASP API7:2023).
    """

    def __init__(
        self, timeout_s: float = 30.0, allowed_hosts: tuple[str, ...] | list[str] = ()
    ) -> None:
        self.http = new_async_client(CALLBACK, timeout_s=timeout_s)
        self.allowed_hosts = tuple(allowed_hosts)

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.http.aclose()

    @activity.defn(name=READ_TASK_CHUNK)
    async def read_task_chunk(self, input: ReadTaskChunkInput) -> ReadTaskChunkOutput:
        """Read up to ``limit`` tasks from the cursor ``offset`` of a JSONL / Parquet file, or
        of a task set (``harbor``, ``swebench``: :mod:`rolloutd.tasksets`).

        Invalid rows do not stop the source: each is reported in ``errors`` with its line
        number (``line 7: ...``; Parquet: ``row 6: ...``) and skipped; the buffer counts them.

        Raises:
            ApplicationError: non-retryable when the file is missing or unreadable.
        """
        task_set = input.format in ("harbor", "swebench")
        try:
            if task_set:
                every = tasksets.task_set_rows(input.format, input.path)  # type: ignore[arg-type]
                chunk = every[input.offset : input.offset + input.limit]
                rows = [SourceRow(f"row {input.offset + i}", r) for i, r in enumerate(chunk)]
                exhausted = input.offset + len(rows) >= len(every)
            else:
                rows, exhausted = read_rows(
                    Path(input.path).expanduser(), input.format, input.offset, input.limit
                )
        except (OSError, ValueError, ConfigError) as e:
            raise ApplicationError(str(e), type="TaskSourceError", non_retryable=True) from e
        tasks: list[TaskRequest] = []
        errors: list[str] = []
        for row in rows:
            if row.error is not None:
                errors.append(f"{row.where}: {row.error}")
                continue
            try:
                if task_set:
                    task = tasksets.row_task(
                        input.format,  # type: ignore[arg-type]
                        row.value,
                        input.options,
                        path=input.path,
                    )
                    tasks.append(task)
                else:
                    tasks.append(_row_to_task(row.value))
            except (ValidationError, ValueError, TypeError, ConfigError) as e:
                errors.append(f"{row.where}: {e}")
        if errors:
            log.warning("task_source_rows_invalid", path=input.path, num_invalid=len(errors))
        return ReadTaskChunkOutput(
            tasks=tasks, errors=errors, next_offset=input.offset + len(rows), exhausted=exhausted
        )

    @activity.defn(name=POST_CALLBACK)
    async def post_callback(self, input: PostCallbackInput) -> PostCallbackOutput:
        """POST one SessionResult (JSON) to a task's ``callback_url``.

        Returns:
            The receiver's status code and this attempt's number (1-based).

        With the task's secret the POST is signed (``X-Rolloutd-Signature``,
        :mod:`rolloutd.security.callbacks`).

        The error a task's status shows says what happened, never what the target said:
        the receiver's status code, or that it did not answer; the transport's own error text
        (which tells a closed port from a filtered one, and carries the target's words) goes
        to this host's log only, and a refused host's message does not list the allowed ones.

        Raises:
            ApplicationError: retryable on connection errors, 5xx, 408/409/425/429;
                non-retryable on other 4xx, and on a host outside ``allowed_hosts``
                (``CallbackRefused``: nothing is sent); its details hold the attempt's number.
        """
        attempt = activity.info().attempt
        structlog.contextvars.bind_contextvars(
            session_id=input.session.session_id, task_id=input.session.task_id, attempt=attempt
        )
        if not callback_host_allowed(input.url, self.allowed_hosts):
            log.warning("callback_refused", num_allowed_hosts=len(self.allowed_hosts))
            raise ApplicationError(
                "callback_url's host is not allowed: nothing was sent (the operator lists "
                "the hosts callbacks may reach in ROLLOUTD_CALLBACK_ALLOWED_HOSTS)",
                attempt,
                type="CallbackRefused",
                non_retryable=True,
            )
        body = input.session.model_dump_json().encode()
        headers = {"content-type": "application/json"}
        if input.secret:
            headers[SIGNATURE_HEADER] = sign_callback(input.secret, body)
        try:
            response = await self.http.post(input.url, content=body, headers=headers)
        except httpx.HTTPError as e:
            log.warning("callback_unanswered", error=f"{type(e).__name__}: {e}")
            raise ApplicationError(
                "callback failed: the receiver did not answer",
                attempt,
                type="CallbackHTTPError",
                non_retryable=not transport_fault(e).retryable,
            ) from e
        _raise_for_status(response, attempt)
        log.info("callback_posted", status_code=response.status_code)
        return PostCallbackOutput(status_code=response.status_code, attempt=attempt)
