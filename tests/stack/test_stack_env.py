"""The environment ``rolloutd up`` gives its fleet processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolloutd.stack.local import MALLOC_TUNABLES, LocalStack


def test_fleets_get_the_malloc_tunables_unless_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in MALLOC_TUNABLES:
        monkeypatch.delenv(name, raising=False)
    env = LocalStack(home=tmp_path, fleets=()).env()
    assert env["MALLOC_ARENA_MAX"] == "2" and env["MALLOC_MMAP_THRESHOLD_"] == "131072"
    # an operator's own value is kept, and extra_env wins over both
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    env = LocalStack(home=tmp_path, fleets=()).env()
    assert env["MALLOC_ARENA_MAX"] == "4" and env["MALLOC_MMAP_THRESHOLD_"] == "131072"
    stack = LocalStack(home=tmp_path, fleets=(), extra_env={"MALLOC_ARENA_MAX": "1"})
    assert stack.env()["MALLOC_ARENA_MAX"] == "1"
