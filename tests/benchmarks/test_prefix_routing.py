"""``benchmarks/prefix_routing.py``'s recorded trace: a run's calls read back from its store
(prompt fields as the harness sent them, the gaps between calls), written and read again, and
the trace the repository ships holds what docs/benchmarks.md says it replays. The replay itself
needs two llama-servers and minutes per mode: it is a benchmark, run by hand."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from rolloutd.records import Completion, Timings
from rolloutd.store import BlobStore, CompletionLog

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "benchmarks" / "traces" / "mini_swe_agent.jsonl.gz"
TASKS = REPO / "benchmarks" / "traces" / "mini_swe_agent_tasks.jsonl"


def bench():
    spec = importlib.util.spec_from_file_location(
        "prefix_routing", REPO / "benchmarks" / "prefix_routing.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call(session: str, index: int, started: float, duration: float, **more) -> Completion:
    messages = [{"role": "user", "content": "task"}] + [
        {"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i}"} for i in range(index)
    ]
    request = {"model": "qwen", "messages": messages, "tools": [{"type": "function"}]}
    request["max_tokens"] = 64
    return Completion(
        session_id=session,
        index=index,
        request=request,
        messages=messages,
        timings=Timings(started_at=started, duration_s=duration),
        **more,
    )


def results_line(session: str, superseded: bool = False) -> str:
    return json.dumps(
        {"session_id": session, "harness": "mini_swe_agent", "model": "q", "superseded": superseded}
    )


def test_a_run_becomes_a_trace_of_its_prompts_and_gaps(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path / "store"))
    log = CompletionLog(store, "t/0")
    log.append(call("t/0", 0, 100.0, 2.0))
    log.append(call("t/0", 1, 102.5, 1.0))  # 0.5 s of tool time after call 0
    log.append(call("t/0", 2, 106.0, 1.0))  # 2.5 s after call 1
    CompletionLog(store, "t/1").append(call("t/1", 0, 100.0, 1.0))
    results = tmp_path / "results.jsonl"
    results.write_text(
        "\n".join([results_line("t/0"), results_line("t/1"), results_line("t/9", True)])
    )

    sessions = bench().record(str(tmp_path / "store"), results)

    assert [s["session_id"] for s in sessions] == ["t/0", "t/1"]  # superseded line skipped
    turns = sessions[0]["turns"]
    assert [t["gap_s"] for t in turns] == [0.5, 2.5, 0.0]
    assert [len(t["body"]["messages"]) for t in turns] == [1, 2, 3]
    # the prompt as sent; the model and sampling fields are the replaying session's
    assert set(turns[2]["body"]) == {"messages", "tools"}
    assert turns[2]["body"]["messages"][-1]["content"] == "out 1"
    assert sessions[0]["harness"] == "mini_swe_agent"


@pytest.mark.parametrize("name", ["trace.jsonl", "trace.jsonl.gz"])
def test_a_written_trace_reads_back_as_its_sessions_turns(tmp_path: Path, name: str) -> None:
    module = bench()
    sessions = [
        {"session_id": "a/0", "turns": [{"body": {"messages": []}, "gap_s": 0.2}]},
        {"session_id": "a/1", "turns": [{"body": {"messages": [1]}, "gap_s": 0.0}] * 2},
    ]
    module.write_trace(sessions, tmp_path / name)
    assert module.read_trace(tmp_path / name) == [s["turns"] for s in sessions]


def test_a_failed_call_or_an_empty_session_is_refused_by_name(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path / "store"))
    log = CompletionLog(store, "t/0")
    log.append(call("t/0", 0, 1.0, 1.0, error="backend 503", finish_reason="error"))
    results = tmp_path / "results.jsonl"
    results.write_text(results_line("t/0"))
    with pytest.raises(ValueError, match="t/0 call 0: backend 503"):
        bench().record(str(tmp_path / "store"), results)
    results.write_text(results_line("t/5"))
    with pytest.raises(ValueError, match="t/5: no recorded call"):
        bench().record(str(tmp_path / "store"), results)


def test_the_shipped_trace_is_32_recorded_mini_swe_agent_sessions_of_20_calls() -> None:
    """The trace docs/benchmarks.md's table replays, as recorded from the tasks file beside it:
    mini-swe-agent's own requests (its system prompt and bash tool on every call), 8 tasks x 4
    samples, 20 calls each (its step limit), each call resending the conversation so far."""
    lines = gzip.decompress(SHIPPED.read_bytes()).decode().splitlines()
    sessions = [json.loads(line) for line in lines]
    tasks = [json.loads(line) for line in TASKS.read_text().splitlines()]
    assert len(sessions) == sum(t["num_samples"] for t in tasks) == 32
    assert {s["harness"] for s in sessions} == {t["harness"]["type"] for t in tasks}
    assert {len(s["turns"]) for s in sessions} == {t["harness"]["max_turns"] for t in tasks}
    for s in sessions:
        first = s["turns"][0]["body"]
        assert first["messages"][0]["role"] == "system"
        assert [t["function"]["name"] for t in first["tools"]] == ["bash"]
        for before, after in zip(s["turns"], s["turns"][1:]):
            sent = before["body"]["messages"]
            assert after["body"]["messages"][: len(sent)] == sent
