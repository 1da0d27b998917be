"""Completion records (rolloutd.store): a completion stores only what it adds to the one it
continues (format 2), readers rebuild every completion in full, and logs written before
(format 1, every field in full) read as before."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rolloutd.proxy.http.server import Gateway
from rolloutd.store import (
    BlobExistsError,
    BlobStore,
    CompletionLog,
    decode_completion,
    encode_completion,
)
from rolloutd.trajectory import build_traces
from rolloutd.types import BuilderSpec, Completion, SamplingParams

MARKER = "first-turn-marker-7f3a"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


async def _converse(gateway: Gateway, fake_llama: Any, num_turns: int) -> str:
    """One tokens-mode session of ``num_turns`` calls, each resending the whole conversation
    (as harnesses do); returns the session id."""
    info = await gateway.sessions.open_session(
        "rec/0", "rec", sampling=SamplingParams(max_tokens=32)
    )
    fake_llama.answers = [f"Answer number {i}." for i in range(num_turns)]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": MARKER},
        {"role": "user", "content": "Start."},
    ]
    transport = httpx.ASGITransport(app=gateway.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
        for turn in range(num_turns):
            response = await client.post(
                f"/s/{info.session_key}/v1/chat/completions",
                json={"model": "m", "messages": messages, "tools": TOOLS},
            )
            assert response.status_code == 200, response.text
            messages += [
                response.json()["choices"][0]["message"],
                {"role": "user", "content": f"Go on ({turn})."},
            ]
    return info.session_id


async def test_records_store_what_is_new_and_read_back_in_full(
    gateway: Gateway, fake_llama: Any
) -> None:
    session_id = await _converse(gateway, fake_llama, 6)
    session = await gateway.sessions.get(session_id)
    log = CompletionLog(gateway.store, session_id)
    raw = [gateway.store.get_bytes(log.key(i)) for i in log.indices()]
    # the first record is whole; every later one is a delta without the earlier conversation
    assert MARKER.encode() in raw[0] and b'"format"' not in raw[0]
    for record in raw[1:]:
        head = json.loads(record)
        assert head["format"] == 2 and head["delta_base"] == head["index"] - 1
        assert set(head["delta"]) >= {"messages", "tools", "prompt_ids", "request.messages"}
        assert MARKER.encode() not in record
    assert len(raw[-1]) < 2 * len(raw[1])  # record size does not grow with the conversation
    # readers see every completion in full, as the gateway holds them
    read = log.read_all()
    assert [c.model_dump() for c in read] == [c.model_dump() for c in session.completions]
    assert read[-1].messages[0]["content"] == MARKER and len(read[-1].messages) == 12
    assert read[-1].request["messages"][0]["content"] == MARKER
    assert read[-1].prompt_ids[: len(read[-2].prompt_ids)] == read[-2].prompt_ids
    # and the builder makes the same traces of both
    spec = BuilderSpec(type="prefix_merging")
    eot = gateway.template.end_of_turn_id
    assert (
        build_traces(read, spec, end_of_turn_id=eot)[0]
        == build_traces(list(session.completions), spec, end_of_turn_id=eot)[0]
    )


async def test_a_restarted_gateway_chains_onto_a_delta_log(
    gateway: Gateway, fake_llama: Any
) -> None:
    session_id = await _converse(gateway, fake_llama, 3)
    gateway.sessions.forget(session_id)
    session = await gateway.sessions.get(session_id)
    assert [c.index for c in session.completions] == [0, 1, 2]
    assert session.completions[2].messages[0]["content"] == MARKER
    assert session.completions[2].extends == 1


def _completion(
    index: int,
    messages: list[dict[str, Any]],
    prompt_ids: list[int],
    response_ids: list[int],
    **extra: Any,
) -> Completion:
    return Completion(
        session_id="s/0",
        index=index,
        messages=messages,
        tools=TOOLS,
        request={"messages": messages, "tools": TOOLS, "stream": False},
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        response_logprobs=[-0.5] * len(response_ids),
        response_message={"role": "assistant", "content": "x"},
        **extra,
    )


def test_format_1_logs_still_read(tmp_path: Any) -> None:
    store = BlobStore(str(tmp_path))
    log = CompletionLog(store, "s/0")
    first = _completion(0, [{"role": "user", "content": "a"}], [1, 2], [3, 4])
    second = _completion(
        1,
        [*first.messages, {"role": "assistant", "content": "x"}, {"role": "user", "content": "b"}],
        [1, 2, 3, 4, 5],
        [6],
        extends=0,
    )
    store.put_bytes(log.key(0), first.model_dump_json().encode())  # written by an old gateway
    log.append(second, first)
    assert log.read_all() == [first, second]


def test_unknown_record_formats_are_refused() -> None:
    record = b'{"format":3,"delta_base":0,"delta":{},"session_id":"s/0","index":1}'
    with pytest.raises(ValueError, match="format 3"):
        decode_completion(record, lambda i: pytest.fail("no base needed"))


_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": st.text(max_size=8)}
)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 6),
            st.lists(_MESSAGE, max_size=3),
            st.integers(0, 8),
            st.lists(st.integers(0, 99), max_size=4),
            st.lists(st.integers(0, 99), max_size=3),
            st.booleans(),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_any_log_reads_back_what_was_appended(
    steps: list[tuple[int, list[Any], int, list[int], list[int], bool]],
) -> None:
    """For any sequence of completions, each keeping some prefix of the previous one's
    messages and of its prompt + response (or none), then adding its own: every record read
    back equals the completion appended."""
    completions: list[Completion] = []
    for index, (keep, new_messages, keep_ids, new_ids, response_ids, same_tools) in enumerate(
        steps
    ):
        previous = completions[-1] if completions else None
        messages = (previous.messages[:keep] if previous else []) + new_messages
        chain = [*previous.prompt_ids, *previous.response_ids] if previous else []
        completion = _completion(index, messages, chain[:keep_ids] + new_ids, response_ids)
        if not same_tools:
            completion.tools = []
        completions.append(completion)
    by_index: dict[int, Completion] = {}
    for completion in completions:
        base = by_index.get(completion.index - 1)
        record = encode_completion(completion, base)
        by_index[completion.index] = decode_completion(record, by_index.__getitem__)
        assert by_index[completion.index] == completion


_KILLED_WRITER = """
import os, signal, sys
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.types import Completion
store = BlobStore(sys.argv[1], sync=sys.argv[2], group_commit_s=5.0)
log = CompletionLog(store, "s/0")
for i in range(3):
    log.append(Completion(session_id="s/0", index=i, messages=[{"role": "user", "content": "a"}],
                          prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-0.1]))
os.kill(os.getpid(), signal.SIGKILL)  # right after the last append returned
"""


@pytest.mark.parametrize("sync", ["group", "always", "os"])
def test_every_sync_policy_survives_a_kill_of_the_writer(tmp_path: Any, sync: str) -> None:
    """Whatever the fsync policy, a completion whose append returned is in the log after the
    writing process is killed (here before its 5 s group-commit window ends)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(tmp_path), sync], timeout=120, check=False
    )
    assert done.returncode == -9
    completions = CompletionLog(BlobStore(str(tmp_path)), "s/0").read_all()
    assert [c.index for c in completions] == [0, 1, 2]
    assert completions[2].messages == [{"role": "user", "content": "a"}]


def test_group_commit_flush_syncs_what_was_written(tmp_path: Any) -> None:
    store = BlobStore(str(tmp_path), sync="group", group_commit_s=5.0)
    store.put_bytes("a/b.json", b"{}")
    assert store.get_bytes("a/b.json") == b"{}"  # readable before any fsync
    assert store.flush(timeout_s=30)
    assert store.flush(timeout_s=30)  # nothing pending: returns at once


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed-file", "named-temporary"])
@pytest.mark.parametrize("sync", ["always", "group", "os"])
def test_a_completion_index_is_written_once(tmp_path: Any, sync: str, unnamed: bool) -> None:
    """Create-exclusive writes (every completion record): the second write of a key is
    refused and the first stays whole; no temporary file is left behind. Both ways of
    writing: unnamed files (``O_TMPFILE``, where the file system has them) and named
    temporary files."""
    store = BlobStore(str(tmp_path), sync=sync)  # type: ignore[arg-type]
    store._unnamed_writes = store._unnamed_writes and unnamed
    store.put_bytes("sessions/t/0/completions/00000000.json", b'{"first": 1}', exclusive=True)
    with pytest.raises(BlobExistsError):
        store.put_bytes("sessions/t/0/completions/00000000.json", b'{"second": 2}', exclusive=True)
    store.put_bytes("sessions/t/0/completions/00000001.json", b"{}", exclusive=True)
    assert store.flush()
    assert store.get_bytes("sessions/t/0/completions/00000000.json") == b'{"first": 1}'
    assert sorted(p.name for p in (tmp_path / "sessions/t/0/completions").iterdir()) == [
        "00000000.json",
        "00000001.json",
    ]


def test_unnamed_writes_give_way_to_named_files_where_proc_cannot_name_them(tmp_path: Any) -> None:
    """A ``/proc`` that cannot link a descriptor (another mount, hidden descriptors): the
    write still lands, through a named temporary file, and so do the later ones."""
    store = BlobStore(str(tmp_path / "store"), sync="group")
    if not store._unnamed_writes:
        pytest.skip("no unnamed files here")
    (tmp_path / "empty").mkdir()
    store._proc_fds = os.open(tmp_path / "empty", os.O_RDONLY | os.O_DIRECTORY)
    store._proc_pid = os.getpid()
    try:
        store.put_bytes("a/0.json", b'{"first": 1}', exclusive=True)
        assert not store._unnamed_writes
        with pytest.raises(BlobExistsError):
            store.put_bytes("a/0.json", b'{"second": 2}', exclusive=True)
        store.put_bytes("a/1.json", b"{}", exclusive=True)
    finally:
        os.close(store._proc_fds)
    assert store.flush()
    assert store.get_bytes("a/0.json") == b'{"first": 1}'
    assert sorted(p.name for p in (tmp_path / "store/a").iterdir()) == ["0.json", "1.json"]
