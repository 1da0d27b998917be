"""What a trainer chooses for every task of an external task set (Harbor, SWE-bench family).

A task set's rows say what to solve, in which container, and how to check it; they do not say
which harness runs, how many samples a group holds, or how it samples. :class:`TaskOptions`
carries those, once for the whole set, into each :class:`~rolloutd.types.TaskRequest` the
set's rows become. :func:`options_from` reads them as a person writes them: JSON, or a JSON or
TOML file.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from rolloutd.payload import Payload, read_document
from rolloutd.task_spec import BuilderSpec, HarnessSpec

#: a task id's characters (``rolloutd.types.TASK_ID_PATTERN``)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class SamplingOptions(Payload):
    """Sampling of every task of the set (:class:`rolloutd.types.SamplingParams`' fields)."""

    temperature: float = Field(default=1.0, ge=0.0, le=5.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=1024, ge=1, le=1_000_000)
    seed: int | None = None


class TaskOptions(Payload):
    """The trainer's choices for every task a task set's rows become."""

    harness: HarnessSpec = Field(
        description="the harness every session runs (``oracle``: the task's reference "
        "solution, where the set has one; ``shell`` with command ``true``: a harness that does "
        "nothing)"
    )
    num_samples: int = Field(
        default=1, ge=1, le=1024, description="sessions per task (the GRPO group size)"
    )
    runtime_type: Literal["podman", "docker"] = Field(
        default="podman", description="the container runtime the tasks' images run in"
    )
    task_id_prefix: str = Field(
        default="",
        max_length=40,
        pattern=r"^[A-Za-z0-9._-]*$",
        description="prepended to every task id (task ids are business keys)",
    )
    run_s: float = Field(
        default=900.0,
        gt=0,
        le=86_400,
        description="the run budget of a task whose row names none (Harbor's ``[agent] "
        "timeout_sec`` wins), s",
    )
    max_run_s: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        description="an upper bound on every task's run budget (None: the row's), s",
    )
    sampling: SamplingOptions | None = Field(
        default=None, description="sampling parameters; None: the task defaults"
    )
    builder: BuilderSpec = Field(default_factory=BuilderSpec, description="the trajectory builder")
    model: str | None = Field(default=None, description="the model name shown to the harness")
    max_session_attempts: int = Field(
        default=3, ge=1, le=10, description="attempts of a session whose sandbox host is lost"
    )
    max_replacements: int = Field(
        default=2,
        ge=0,
        le=64,
        description="new sessions of a sample that ended with a retryable infrastructure "
        "cause, per group",
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="merged into every task's metadata"
    )
    store_final_state: bool = Field(
        default=False,
        description="store each session's final state for `rolloutd reverify` "
        "(TaskRequest.store_final_state)",
    )

    def task_id(self, key: str) -> str:
        """The task id of a row keyed ``key``: the prefix, then the key made id-safe.

        Characters a task id refuses become ``_``; a key that changed, or that is too long,
        gets 8 hex digits of its sha256, so distinct keys stay distinct.
        """
        safe = _UNSAFE.sub("_", key.replace("/", "__")).lstrip("._-") or "task"
        if safe != key.replace("/", "__") or len(self.task_id_prefix + safe) > 128:
            digest = hashlib.sha256(key.encode()).hexdigest()[:8]
            safe = f"{safe[: 118 - len(self.task_id_prefix)]}-{digest}"
        return f"{self.task_id_prefix}{safe}"

    def run_budget(self, asked_s: float | None) -> float:
        """The run budget of a task whose row asks for ``asked_s`` (None: not said), s."""
        budget = asked_s or self.run_s
        return min(budget, self.max_run_s) if self.max_run_s else budget


def options_from(text: str) -> dict[str, Any]:
    """Task-set options as given on a command line (``rolloutd submit --options``): a JSON
    object, or the path of a ``.json`` or ``.toml`` file holding one. Check them with
    :func:`rolloutd.tasksets.task_options` (``strict=True``), which refuses an unknown field
    by name whichever the format.

    Raises:
        ValueError: not a JSON object, or a file that is not JSON (TOML) or holds no object.
        OSError: the file cannot be read.
    """
    if text.lstrip().startswith("{"):
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"options: a JSON object is needed, not {type(data).__name__}")
        return data
    path = Path(text).expanduser()
    if path.suffix not in (".json", ".toml"):
        raise ValueError(f"options {text!r}: a JSON object, or a .json or .toml file")
    return read_document(path)
