"""POLAR's appendix A.3 payload (examples/polar_a3.json) maps onto a task the fleets run: the
REST facade's translation, no server. The payload run end to end:
tests/sandbox/harnesses/acceptance/test_polar_codex.py."""

from __future__ import annotations

import json
from pathlib import Path

from rolloutd.polar import PolarTaskRequest, to_task_request
from rolloutd.types import TaskRequest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "polar_a3.json"


def test_the_example_payload_maps_onto_a_task_request():
    polar = PolarTaskRequest.model_validate(json.loads(EXAMPLE.read_text()))
    task = TaskRequest.model_validate(to_task_request(polar))
    assert (task.harness.type, task.builder.type, task.evaluator.type, task.evaluator.runtime) == (
        "codex",
        "prefix_merging",
        "swebench",
        "fresh",
    )
    assert (task.runtime.type, task.runtime.network) == ("bwrap", "gateway")
    assert "calc/ops.py" in task.runtime.files and task.runtime.prepare
    assert (task.sampling.seed, task.phases.run_s) == (7, 900)
    assert task.metadata["instance_id"] == "calc__mean-1"
    assert task.callback_url == polar.callback_url
