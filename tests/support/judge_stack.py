"""A stack with a judge pool: the four fleets in a namespace of their own, the policy on the
session's llama-server (tests/conftest.py ``engine``), the judge on a llama-server of its own
(the catalog's Qwen2.5-Coder-0.5B-Instruct under the judge pool, served apart so a test can kill
and restart it), and the docstring task the judge tests submit."""

from __future__ import annotations

import contextlib
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

#: the rubric the judge tests score with (examples/judges.jsonl carries the same one)
DOCSTRING_RUBRIC: dict[str, Any] = {
    "name": "docstring",
    "version": 1,
    "criteria": [
        {"name": "accuracy", "description": "says what the function does, nothing false"},
        {"name": "clarity", "description": "short, plain and readable", "weight": 0.5},
    ],
    "scale_min": 0,
    "scale_max": 10,
}


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
    """A docstring-writing task on the python harness (examples/agents/file_agent.py, one
    turn, the local runtime), scored by the LLM judge with :data:`DOCSTRING_RUBRIC`."""
    return {
        "task_id": f"judge-{uuid.uuid4().hex[:8]}",
        "instruction": "Write a one-line docstring for this function, and answer with the "
        "docstring only:\n\ndef add(a, b):\n    return a + b",
        "num_samples": num_samples,
        "harness": {
            "type": "python",
            "entry": "file_agent:agent",
            "max_turns": 1,
            "files": {"file_agent.py": AGENT.read_text()},
        },
        "runtime": {"type": "local"},
        "evaluator": {
            "type": "llm_judge",
            "judge": {"rubric": DOCSTRING_RUBRIC, "max_tokens": 64, "timeout_s": 60}
            | (judge or {}),
        },
        "sampling": {"temperature": 0.7, "max_tokens": 48},
        "phases": {"run_s": 120},
    } | fields
