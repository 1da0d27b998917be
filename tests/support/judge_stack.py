"""A stack with a judge pool: the four fleets in a namespace of their own, the policy on the
session's llama-server (tests/conftest.py ``engine``), the judge on a llama-server of its own
(the catalog's Qwen2.5-Coder-0.5B-Instruct under the judge pool, served apart so a test can kill
and restart it), and the docstring task the judge tests submit."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rolloutd.engine.server import LlamaServer
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from tests.support.namespaced_fleets import NamespacedFleets, namespaced_fleets

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "examples" / "agents" / "file_agent.py"

#: the example task set of judged tasks (docstring, bug explanation, a group-judged docstring)
EXAMPLES = ROOT / "examples" / "judges.jsonl"


def example(task_id: str) -> dict[str, Any]:
    """The task ``task_id`` of :data:`EXAMPLES`."""
    return next(
        task
        for line in EXAMPLES.read_text().splitlines()
        if line.strip() and (task := json.loads(line))["task_id"] == task_id
    )


#: the rubric the judge tests score with: the docstring example's
DOCSTRING_RUBRIC: dict[str, Any] = example("judge-docstring")["evaluator"]["judge"]["rubric"]


def judge_server(port: int = 0) -> LlamaServer:
    """The judge's llama-server (not started): two slots, an 8k context."""
    return LlamaServer("qwen2.5-coder-0.5b", port=port, parallel=2, ctx_size=8192)


@contextlib.asynccontextmanager
async def judge_stack(
    address: str, home: Path, policy_url: str, judge_url: str, *, tag: str, **eval_host: Any
) -> AsyncIterator[tuple[NamespacedFleets, RolloutClient]]:
    """Fleets whose gateway has the judge pool at ``judge_url``, and a client of them."""
    async with namespaced_fleets(
        address,
        home,
        policy_url,
        tag=tag,
        sandbox=True,
        gateway={"judge_backend_url": judge_url},
        eval_host=eval_host or None,
    ) as fleets:
        yield fleets, RolloutClient(fleets.client, BlobStore(fleets.store_url))


def docstring_task(
    num_samples: int = 2, *, judge: dict[str, Any] | None = None, **fields: Any
) -> dict[str, Any]:
    """The docstring example (:data:`EXAMPLES`) under a task id of its own, on the local
    runtime (the tests' stack allows it), the python harness making one call, its judge spec
    updated with ``judge``."""
    task = example("judge-docstring")
    task["evaluator"]["judge"] |= judge or {}
    return (
        task
        | {
            "task_id": f"judge-{uuid.uuid4().hex[:8]}",
            "num_samples": num_samples,
            "runtime": {"type": "local"},
        }
        | fields
    )
