"""The rows ``rolloutd doctor`` prints and what every check reads (:mod:`rolloutd.cli.checks`):
:class:`Check` and its three statuses, :class:`Target`, and the probe-command helper."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rolloutd.sandbox_policy import SandboxPolicy

#: what a check found: ``ok``, ``miss`` (something rolloutd needs is missing or broken) or
#: ``skipped`` (not needed with these settings, or not checkable: the row says why).
Status = Literal["ok", "miss", "skipped"]
#: seconds one probe command, connection or request may take
PROBE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Check:
    """One row of ``rolloutd doctor``'s table.

    Attributes:
        name: what was checked (``bwrap``, ``port 8300 (gateway)``).
        status: ``ok``, ``miss`` or ``skipped``.
        detail: what was found (``ok``), what is wrong (``miss``) or why it was not checked
            (``skipped``).
        fix: how to fix a miss (empty otherwise).
    """

    name: str
    status: Status
    detail: str
    fix: str = ""


def ok(name: str, detail: str) -> Check:
    """An ``ok`` row."""
    return Check(name, "ok", detail)


def miss(name: str, detail: str, fix: str) -> Check:
    """A ``miss`` row with its fix."""
    return Check(name, "miss", detail, fix)


def skipped(name: str, why: str) -> Check:
    """A ``skipped`` row saying why."""
    return Check(name, "skipped", why)


@dataclass
class Target:
    """What the checks look at: the settings and options of the command.

    Attributes:
        home: rolloutd's home (a running ``up`` stack's state file lies there).
        cache: the model and CLI cache.
        runtime_root: where the sandbox fleet makes runtimes.
        policy: the sandbox policy as the operator set it (its ``runtimes`` are checked when
            the operator named them).
        address: Temporal's address when one is configured or given; None: not checked
            (``up`` starts its own).
        namespace: Temporal namespace.
        store_url: the blob store's fsspec URL.
        engine_url: an engine to check (``--engine-url``, ``ROLLOUTD_BACKEND_URL``, a running
            stack's), one base URL or several comma-separated (a pool); None: check what
            ``up`` would start.
        engine_api_key: the engine's API key, if it wants one.
        model: the catalog model ``up`` serves, or the name the engine serves.
        tokenizer: a catalog name, a tokenizer folder or a Hugging Face repo id.
        ports: port -> what ``up`` binds there.
        stack_pid: pid of a running ``up`` on ``home`` (its ports are taken by it), or None.
        engine_kind: the kind of ``engine_url``'s servers (``llama_cpp``, ``vllm``,
            ``sglang``, ``openai``): each is asked as that kind
            (:func:`rolloutd.stack.engine_check.check_engine`).
        tokenizer_revision: the revision of a repo-id tokenizer; None: its default branch.
    """

    home: Path
    cache: Path
    runtime_root: Path
    policy: SandboxPolicy
    address: str | None
    namespace: str
    store_url: str
    engine_url: str | None
    engine_api_key: str | None
    model: str
    tokenizer: str
    ports: dict[int, str]
    stack_pid: int | None = None
    engine_kind: str = "llama_cpp"
    tokenizer_revision: str | None = None


def run_command(argv: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int, str]:
    """Run a probe command; its exit code (127: not found, -9: timed out) and its output."""
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return -9, f"{argv[0]} timed out after {timeout_s:.0f} s"
    return done.returncode, (done.stdout + done.stderr).strip()


def sysctl(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def checked_runtimes(policy: SandboxPolicy) -> list[str]:
    """The runtime types whose needs are checked: the operator's ``runtimes``, else bwrap and
    podman (the isolating runtimes whose isolation rolloutd sets itself)."""
    if "runtimes" in policy.model_fields_set:
        return list(policy.runtimes)
    return [r for r in policy.runtimes if r in ("bwrap", "podman")]
