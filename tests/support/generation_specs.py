"""A generation of rows that each run ``true`` once (shell harness, local runtime, scored by
``session_completed``): what the generation tests drive when the harness is not the point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rolloutd.workflows.generation.models import GenerationSpec


def true_rows_spec(name: str, folder: Path, num_rows: int, **fields: Any) -> GenerationSpec:
    """Write ``num_rows`` rows (``{"id": "r{i}", "prompt": "row {i}"}``) to
    ``folder/rows.jsonl`` and return a spec ``name`` generating them into ``folder/out``;
    ``fields`` are more top-level spec fields (``rows_per_run``, ...)."""
    rows = folder / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"id": f"r{i}", "prompt": f"row {i}"}) + "\n" for i in range(num_rows))
    )
    return GenerationSpec.model_validate(
        {
            "name": name,
            "source": {"type": "jsonl", "path": str(rows)},
            "template": {
                "instruction": "{prompt}",
                "num_samples": 1,
                "harness": {"type": "shell", "command": "true"},
                "runtime": {"type": "local"},
                "evaluator": {"type": "session_completed"},
            },
            "outputs": {"dir": str(folder / "out")},
            **fields,
        }
    )
