"""Routed experts (R3) through the real gateway: a 4-turn session on a vLLM- and an
SGLang-format backend, merged into one trace, exported for verl and SkyRL.

The backends are test doubles (``httpx.MockTransport``): no GPU engine runs here, and no engine
that runs here returns routed experts. Each answers in the wire format read in that engine's
source at a pinned version:

- vLLM, commit 002032ee2b18, ``vllm/entrypoints/openai/completion/protocol.py``
  (``CompletionResponseChoice.routed_experts``): base64 of a ``.npy`` array of shape
  ``(prompt + sampled - 1, num_layers, num_experts_per_tok)`` on a non-streamed Completions
  choice;
- SGLang, commit d4d0fc58371761, ``python/sglang/srt/layers/moe/routed_experts_capturer.py``
  (``extract_routed_experts_from_meta_info``): ``meta_info.routed_experts``, base64 of the
  flattened int32 ids of ``seqlen - 1`` tokens, when the request says
  ``return_routed_experts``.

Each call's routes depend on the call number, as an engine that recomputes a cached prefix
may route it otherwise: the trace must keep, for each position, the routes of the first call
that fed that token (the ones its samples were drawn under).
"""

from __future__ import annotations

import base64
import io
import json
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from rolloutd.proxy.http.server import Gateway
from rolloutd.routes import load_routes, store_trace_routes
from rolloutd.settings import GatewaySettings
from rolloutd.store import CompletionLog
from rolloutd.trainer_client.bridges.common import group_samples
from rolloutd.trainer_client.training.exports import (
    to_parquet,
    to_slime_samples,
    to_verl_batch,
)
from rolloutd.trajectory import build_traces, check_invariants
from rolloutd.types import (
    BuilderSpec,
    SessionResult,
    SessionStatus,
    TaskResult,
    Trajectory,
)
from tests.proxy.support import asgi_client

NUM_LAYERS, TOP_K, NUM_EXPERTS = 3, 2, 64
ANSWERS = ["First answer.", "Second one here.", "Third.", "The fourth and last answer."]


def routes_for(prompt: list[int], sampled: list[int], call: int) -> np.ndarray:
    """The double's routes of ``prompt + sampled`` less the last token: a function of the
    position, the token and the call number."""
    tokens = [*prompt, *sampled][:-1]
    rows = np.zeros((len(tokens), NUM_LAYERS, TOP_K), dtype=np.int32)
    for p, token in enumerate(tokens):
        for layer in range(NUM_LAYERS):
            for k in range(TOP_K):
                rows[p, layer, k] = (token * 7 + p * 3 + layer * 5 + k + call * 11) % NUM_EXPERTS
    return rows


class EngineDouble:
    """A vLLM or SGLang server as its source says it answers, sampling scripted answers."""

    def __init__(self, kind: str, tokenizer: Any) -> None:
        self.kind = kind
        self.tokenizer = tokenizer
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.calls: list[tuple[list[int], list[int], np.ndarray]] = []
        self.bodies: list[dict[str, Any]] = []
        self.transport = httpx.MockTransport(self.handle)

    def _sample(self, prompt: list[int]) -> tuple[list[int], np.ndarray]:
        text = ANSWERS[len(self.calls) % len(ANSWERS)]
        sampled = [*self.tokenizer.encode(text, add_special_tokens=False), self.eot]
        rows = routes_for(prompt, sampled, len(self.calls))
        self.calls.append((prompt, sampled, rows))
        return sampled, rows

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            if self.kind == "vllm":
                return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 8192}]})
            return httpx.Response(200, json={"context_length": 8192})
        body = json.loads(request.content)
        self.bodies.append(body)
        if self.kind == "vllm":
            sampled, rows = self._sample(body["prompt"])
            buffer = io.BytesIO()
            np.save(buffer, rows.astype(np.uint16))
            choice = {
                "index": 0,
                "text": self.tokenizer.decode(sampled[:-1]),
                "logprobs": {
                    "token_logprobs": [-0.5] * len(sampled),
                    "tokens": [f"token_id:{t}" for t in sampled],
                },
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": sampled,
                "routed_experts": base64.b64encode(buffer.getvalue()).decode(),
            }
            return httpx.Response(
                200,
                json={"id": "cmpl-1", "choices": [choice], "usage": {"prompt_tokens": 1}},
            )
        sampled, rows = self._sample(body["input_ids"])
        meta = {
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(sampled),
            "cached_tokens": 0,
            "finish_reason": {"type": "stop", "matched": self.eot},
            "output_token_logprobs": [[-0.5, t, None] for t in sampled],
        }
        if body.get("return_routed_experts"):
            meta["routed_experts"] = base64.b64encode(rows.tobytes()).decode()
        return httpx.Response(
            200,
            json={
                "text": self.tokenizer.decode(sampled[:-1]),
                "output_ids": sampled,
                "meta_info": meta,
            },
        )


def first_feeder_routes(calls: list[tuple[list[int], list[int], np.ndarray]]) -> np.ndarray:
    """What the trace must hold: position p's routes from the first call that fed token p
    (each call feeds its prompt and its samples but the last)."""
    parts, covered = [], 0
    for prompt, sampled, rows in calls:
        end = len(prompt) + len(sampled) - 1
        parts.append(rows[covered:end])
        covered = end
    return np.concatenate(parts)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_routed_experts_survive_a_four_turn_merge_into_verl_and_skyrl(
    tmp_path: Path, tokenizer: Any, kind: str
) -> None:
    pytest.importorskip("torch")  # verl's batch is tensors; the lowest-floors env has no torch
    engine = EngineDouble(kind, tokenizer)
    # SGLang is told to ask for the routes and their shape, as an operator's settings say
    sglang = (
        {"backend_return_routed_experts": True, "backend_routed_experts_shape": (NUM_LAYERS, TOP_K)}
        if kind == "sglang"
        else {}
    )
    settings = GatewaySettings(
        store_url=str(tmp_path / "store"),
        backend_url="http://engine",
        backend_type=kind,
        gateway_public_url="http://gateway.test",
        **sglang,
    )
    gateway = Gateway.from_settings(settings, tokenizer=tokenizer, transport=engine.transport)
    try:
        info = await gateway.sessions.open_session("r3/0", "r3")
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Turn one."}]
        async with asgi_client(gateway) as http:
            for turn in range(4):
                response = await http.post(
                    f"/s/{info.session_key}/v1/chat/completions",
                    json={"model": "m", "messages": messages},
                )
                assert response.status_code == 200, response.text
                answer = response.json()["choices"][0]["message"]["content"]
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": f"Turn {turn + 2}."},
                ]
        if kind == "sglang":
            assert all(b["return_routed_experts"] is True for b in engine.bodies)
        store = gateway.store
        log = CompletionLog(store, "r3/0").read_all()
        assert [c.extends for c in log] == [None, 0, 1, 2]
        assert {c.backend_type for c in log} == {kind}
        # stored out of line, each completion only the rows past its base's
        assert all(c.routed_experts is not None for c in log)
        assert log[1].routed_experts.start == log[0].routed_experts.num_rows  # type: ignore[union-attr]

        traces, stats = build_traces(
            log, BuilderSpec(type="prefix_merging"), end_of_turn_id=engine.eot
        )
        check_invariants(traces, log)
        assert len(traces) == 1 and traces[0].completion_indices == [0, 1, 2, 3]
        store_trace_routes(store, "r3/0", traces, log)
        (trace,) = traces
        expected = first_feeder_routes(engine.calls)
        # the trace is the last call's prompt and samples: every token but the last has a row
        assert expected.shape[0] == len(trace.prompt_ids) + len(trace.response_ids) - 1
        trajectory = Trajectory(
            session_id="r3/0", task_id="r3", traces=traces, stats=stats, reward=1.0
        )
        for t in trajectory.traces:
            t.reward = 1.0

        # verl: rolloutd's DataProto export, the rows laid out as verl's _postprocess does
        batch = to_verl_batch([trajectory], pad_token_id=0, store=store)
        routed = batch["routed_experts"].numpy()
        assert routed.shape == (1, batch["input_ids"].shape[1], NUM_LAYERS, TOP_K)
        assert np.array_equal(routed[0, : expected.shape[0]], expected)
        assert not routed[0, expected.shape[0] :].any()
        # the log-prob mode the gateway recorded from this kind's source travels with the row
        mode = {"vllm": "raw", "sglang": "temperature"}[kind]
        assert {c.logprob_mode for c in log} == {mode}
        assert list(batch["logprob_modes"]) == [[mode]]
        (slime,) = to_slime_samples([trajectory])
        assert slime["metadata"]["logprob_modes"] == [mode] * 4
        assert [u["max_tokens"] for u in slime["metadata"]["sampling"]] == [
            c.sampling.max_tokens  # type: ignore[union-attr]
            for c in log
        ]
        to_parquet([trajectory], tmp_path / "r3.parquet")
        table = pq.read_table(tmp_path / "r3.parquet")
        assert table.column("logprob_modes").to_pylist() == [[mode] * 4]
        assert table.column("response_offsets").to_pylist() == [trace.response_offsets]

        # the bridges' sample: verl's AgentLoopOutput.routed_experts and SkyRL's
        # rollout_expert_indices are this array
        session = SessionResult(
            session_id="r3/0",
            task_id="r3",
            status=SessionStatus.COMPLETED,
            reward=1.0,
            trajectory_ref="t",
        )
        samples = group_samples(
            TaskResult(task_id="r3", sessions=[session]),
            lambda s: trajectory,
            1,
            partial(load_routes, store),
        )
        (sample,) = samples.samples
        assert np.array_equal(sample.routed_experts, expected)
        assert sample.token_policy_versions == [0] * len(trace.response_ids)
    finally:
        await gateway.aclose()
