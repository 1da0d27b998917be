"""Build the swebench-style example task (``examples/swebench.jsonl``) from this folder.

The repository under ``repo/`` has a bug: ``calc.ops.mean`` floors and divides by zero.
``test.patch`` adds the tests that expose it; ``gold.patch`` fixes it, ``wrong.patch`` only
half fixes it. The task carries the repository as ``runtime.files``, turns it into a git
repository with a prepare step, and is scored by the ``swebench`` evaluator in a fresh runtime
provisioned while the harness runs::

    python3 examples/swebench_task/make_task.py > examples/swebench.jsonl

``task(harness=...)`` is what tests use to run the same task with a harness that applies
``gold.patch`` or ``wrong.patch``. ``polar_a3()`` is the same task as POLAR's appendix A.3
payload (harness ``codex``, builder ``prefix_merging``, evaluator ``swebench_harness`` with
``refresh_runtime``, a callback, metadata) for ``POST /rollout/task/submit`` of
``rolloutd rest``, with ``runtime.backend: bwrap`` and the repository as ``runtime.files``::

    python3 examples/swebench_task/make_task.py --polar > examples/polar_a3.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

FAIL_TO_PASS = [
    "tests/test_mean.py::test_mean_is_exact",
    "tests/test_mean.py::test_mean_of_empty_raises",
]
PASS_TO_PASS = ["tests/test_mean.py::test_mean_of_ints", "tests/test_ops.py::test_add"]
INSTRUCTION = (
    "calc.ops.mean returns a floored value and fails with ZeroDivisionError on an "
    "empty list. Make it return the exact mean, and raise ValueError for an empty "
    "list."
)
GIT_INIT = (
    "git init -q && git add -A && git -c user.name=rolloutd "
    "-c user.email=rolloutd@localhost commit -q -m base"
)


def repo_files() -> dict[str, str]:
    """Workspace-relative path -> text of every file of ``repo/``."""
    root = HERE / "repo"
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def patch_harness(patch_name: str) -> dict[str, Any]:
    """A shell harness that applies ``{patch_name}`` (a stand-in for an agent)."""
    patch = (HERE / patch_name).read_text()
    return {
        "type": "shell",
        "command": f"cat > /tmp/fix.patch <<'ROLLOUTD_EOF'\n{patch}ROLLOUTD_EOF\n"
        "git apply /tmp/fix.patch",
    }


def task(
    task_id: str = "swebench-calc-mean",
    harness: dict[str, Any] | None = None,
    runtime: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The task request (a dict for ``RolloutClient.submit``)."""
    runtime = {
        "type": "bwrap",
        "files": repo_files(),
        "prepare": [{"type": "exec", "command": GIT_INIT}],
        **(runtime or {}),
    }
    return {
        "task_id": task_id,
        "instruction": INSTRUCTION,
        "num_samples": 1,
        "harness": harness or {"type": "qwen_code", "profile": "compact", "max_turns": 6},
        "runtime": runtime,
        "evaluator": {
            "type": "swebench",
            "runtime": "fresh",
            "timeout_s": 120,
            "params": {
                "test_patch": (HERE / "test.patch").read_text(),
                "fail_to_pass": FAIL_TO_PASS,
                "pass_to_pass": PASS_TO_PASS,
            },
        },
        "phases": {"run_s": 300},
    }


#: the instruction with the way in spelled out: Qwen2.5-Coder-0.5B in Codex, told only the bug,
#: called a tool named after the function (``calc.ops.mean``) and repeated Codex's "unsupported
#: call" answer until the run budget ran out
POLAR_INSTRUCTION = (
    INSTRUCTION + " The repository is /workspace; the only tool is exec_command. Edit "
    "calc/ops.py by calling exec_command with a shell command, for example: "
    "sed -i 's|return sum(values) // len(values)|return sum(values) / len(values)|' "
    "calc/ops.py"
)


def polar_a3(
    task_id: str = "polar-a3-calc-mean", callback_url: str = "http://127.0.0.1:8765/callback"
) -> dict[str, Any]:
    """POLAR's appendix A.3 payload for this task (a dict for ``POST /rollout/task/submit``).

    ``runtime.files``, ``runtime.prepare``, ``sampling`` and ``phases`` are rolloutd's own fields
    (docs/polar.md): POLAR's payload names a SWE-bench image that holds the repository.
    """
    return {
        "task_id": task_id,
        "instruction": POLAR_INSTRUCTION,
        "num_samples": 2,
        "timeout_seconds": 1800,
        "runtime": {
            "backend": "bwrap",
            "network": "gateway",
            "files": repo_files(),
            "prepare": [{"type": "exec", "command": GIT_INIT}],
        },
        "agent": {
            "harness": "codex",
            "model_name": "Qwen2.5-Coder-0.5B-Instruct",
            "settings": {"max_turns": 1, "profile": "compact"},
        },
        "builder": {"strategy": "prefix_merging", "config": {}},
        "evaluator": {
            "strategy": "swebench_harness",
            "config": {
                "refresh_runtime": True,
                "timeout_s": 120,
                "test_patch": (HERE / "test.patch").read_text(),
                "fail_to_pass": FAIL_TO_PASS,
                "pass_to_pass": PASS_TO_PASS,
            },
        },
        "sampling": {"temperature": 0.2, "max_tokens": 256, "seed": 7},
        "phases": {"run_s": 900},
        "callback_url": callback_url,
        "metadata": {"dataset": "examples/swebench_task", "instance_id": "calc__mean-1"},
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["--polar"]:
        sys.stdout.write(json.dumps(polar_a3(), indent=1) + "\n")
    else:
        sys.stdout.write(json.dumps(task()) + "\n")
