"""A stand-in for a GPU engine: a real llama-server behind vLLM's or SGLang's HTTP interface.

No vLLM or SGLang server runs here (no GPU). This process speaks one of their wire formats,
as their documentation and rolloutd's backend clients describe it
(:mod:`rolloutd.proxy.backends.vllm`, :mod:`rolloutd.proxy.backends.sglang`), and samples
every call on a real llama-server through rolloutd's own llama.cpp client
(:class:`rolloutd.proxy.backends.llama_cpp.LlamaCppBackend`): the token ids and logprobs it
answers are the engine's, only their envelope is the other kind's. It is a test double of the
interface, never a check of vLLM's or SGLang's behaviour (their samplers, log-prob modes and
caches are not reproduced).

- ``vllm``: ``GET /v1/models`` (``data[].max_model_len``), ``POST /v1/completions`` with a
  token-id prompt, ``return_token_ids`` and ``logprobs`` (``choices[0].token_ids``,
  ``logprobs.tokens`` as ``token_id:N``, ``logprobs.token_logprobs``, ``stop_reason`` None
  when the end-of-generation token stopped it), streamed as one chunk per token;
- ``sglang``: ``GET /get_model_info`` (``context_length``), ``GET /v1/models``,
  ``POST /generate`` with ``input_ids`` and ``return_logprob`` (``output_ids``,
  ``meta_info.output_token_logprobs`` as ``[logprob, id, None]``, ``finish_reason``
  ``{"type": "stop", "matched": id}``), streamed as cumulative events.

Every request is appended to ``--log`` as one JSON line (route and body), so a test can show
which routes the gateway called.

Run: ``python -m tests.support.engine_fronts --kind vllm --engine URL --model NAME --port P``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from rolloutd.proxy.backends.base import GenerateRequest, GenerateResult
from rolloutd.proxy.backends.llama_cpp import LlamaCppBackend


def _sse(events: Iterator[dict[str, Any]]) -> StreamingResponse:
    def lines() -> Iterator[bytes]:
        for event in events:
            yield f"data: {json.dumps(event)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream")


def vllm_choice(result: GenerateResult, ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    """One Completions choice (or stream chunk) for ``ids`` of ``result``."""
    return {
        "index": 0,
        "text": "",
        "token_ids": ids,
        "logprobs": {
            "tokens": [f"token_id:{i}" for i in ids],
            "token_logprobs": logprobs,
            "top_logprobs": None,
            "text_offset": [0] * len(ids),
        },
        "finish_reason": None,
        "stop_reason": None,
    }


def vllm_answer(result: GenerateResult, prompt_ids: list[int], model: str) -> dict[str, Any]:
    """vLLM's ``text_completion`` for ``result`` (return_token_ids, logprobs=1)."""
    choice = vllm_choice(result, result.response_ids, result.response_logprobs)
    choice.update(
        text=result.text,
        prompt_token_ids=prompt_ids,
        finish_reason=result.finish_reason,
        # vLLM: None when the model's end-of-generation token stopped it, else the stop string
        stop_reason=None if result.ended_by_eos or result.finish_reason == "length" else "",
    )
    return {
        "id": "cmpl-front",
        "object": "text_completion",
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(result.response_ids),
            "total_tokens": len(prompt_ids) + len(result.response_ids),
        },
    }


def vllm_chunks(result: GenerateResult, model: str) -> Iterator[dict[str, Any]]:
    """vLLM's stream for ``result``: a chunk per token, the text on the last one."""
    ids, logprobs = result.response_ids, result.response_logprobs
    steps = [([t], [lp]) for t, lp in zip(ids, logprobs, strict=True)] or [([], [])]
    for i, (step_ids, step_logprobs) in enumerate(steps):
        choice = vllm_choice(result, step_ids, step_logprobs)
        if i == len(steps) - 1:
            choice.update(
                text=result.text,
                finish_reason=result.finish_reason,
                stop_reason=None if result.ended_by_eos or result.finish_reason == "length" else "",
            )
        yield {"id": "cmpl-front", "object": "text_completion", "model": model, "choices": [choice]}


def sglang_answer(result: GenerateResult, num_prompt: int, upto: int | None = None) -> dict:
    """SGLang's ``/generate`` answer for ``result`` (or a stream event holding its first
    ``upto`` tokens, cumulative, without a finish)."""
    n = len(result.response_ids) if upto is None else upto
    ids = result.response_ids[:n]
    finish: dict[str, Any] | None = None
    if upto is None:
        finish = (
            {"type": "stop", "matched": ids[-1]}
            if result.ended_by_eos
            else {"type": "length", "length": len(ids)}
        )
    return {
        "text": result.text if upto is None else "",
        "output_ids": ids,
        "meta_info": {
            "id": "front",
            "prompt_tokens": num_prompt,
            "completion_tokens": n,
            "cached_tokens": 0,
            "finish_reason": finish,
            "output_token_logprobs": [
                [lp, i, None] for lp, i in zip(result.response_logprobs[:n], ids, strict=True)
            ],
        },
    }


def build_app(kind: str, engine_url: str, model: str, log: Path | None = None) -> FastAPI:
    """The front of ``kind`` (``vllm`` or ``sglang``) over the llama-server at ``engine_url``,
    serving the model as ``model``."""
    backend: dict[str, LlamaCppBackend] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        backend["llama"] = LlamaCppBackend("front", engine_url)
        yield
        await backend["llama"].aclose()

    app = FastAPI(lifespan=lifespan)

    @app.middleware("http")
    async def record(request: Request, call_next: Any) -> Any:
        if log is not None:
            body = await request.body()
            with log.open("a") as f:
                f.write(
                    json.dumps(
                        {
                            "method": request.method,
                            "path": request.url.path,
                            "body": json.loads(body) if body else None,
                        }
                    )
                    + "\n"
                )
        return await call_next(request)

    async def ctx() -> int:
        return await backend["llama"].context_size()

    async def sample(prompt_ids: list[int], max_tokens: int, sampling: dict[str, Any]) -> Any:
        top_k = int(sampling.get("top_k", -1))
        return await backend["llama"].generate(
            GenerateRequest(
                prompt_ids=prompt_ids,
                max_tokens=max_tokens,
                temperature=float(sampling.get("temperature", 1.0)),
                top_p=float(sampling.get("top_p", 1.0)),
                top_k=top_k if top_k > 0 else 0,
                seed=sampling.get("seed", sampling.get("sampling_seed")),
            )
        )

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        entry: dict[str, Any] = {"id": model, "object": "model", "owned_by": kind}
        if kind == "vllm":
            entry["max_model_len"] = await ctx()
        return {"object": "list", "data": [entry]}

    if kind == "vllm":

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            prompt = body["prompt"]
            if not (isinstance(prompt, list) and all(isinstance(i, int) for i in prompt)):
                return JSONResponse({"error": {"message": "front: token prompts only"}}, 400)
            result = await sample(prompt, int(body.get("max_tokens") or 16), body)
            if body.get("stream"):
                return _sse(vllm_chunks(result, model))
            return vllm_answer(result, prompt, model)

    elif kind == "sglang":

        @app.get("/get_model_info")
        async def model_info() -> dict[str, Any]:
            return {"model_path": model, "is_generation": True, "context_length": await ctx()}

        @app.post("/generate")
        async def generate(request: Request) -> Any:
            body = await request.json()
            sampling = body.get("sampling_params") or {}
            prompt = body["input_ids"]
            result = await sample(prompt, int(sampling.get("max_new_tokens") or 16), sampling)
            if body.get("stream"):
                n = len(result.response_ids)
                return _sse(
                    iter(
                        [sglang_answer(result, len(prompt), upto) for upto in range(1, n)]
                        + [sglang_answer(result, len(prompt))]
                    )
                )
            return sglang_answer(result, len(prompt))

    else:
        raise ValueError(f"no front for kind {kind!r}")
    return app


@contextmanager
def front_process(
    kind: str, engine_url: str, model: str, folder: Path, timeout_s: float = 60
) -> Iterator[str]:
    """Run the front of ``kind`` in a process of its own on a free port for the length of a
    block; yields its base URL. Its requests are logged to ``folder/{kind}-requests.jsonl``,
    its output to ``folder/{kind}-front.log``; it is stopped by its pid."""
    import sys
    import time

    from rolloutd.processes import free_port, spawn, stop_process

    port = free_port()
    command = [sys.executable, "-m", "tests.support.engine_fronts", "--kind", kind]
    command += ["--engine", engine_url, "--model", model, "--port", str(port)]
    command += ["--log", str(folder / f"{kind}-requests.jsonl")]
    # run from the repository's root, as pytest is: ``-m tests.support...`` imports from there
    proc = spawn(command, log_path=folder / f"{kind}-front.log")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (folder / f"{kind}-front.log").read_text()
            assert time.monotonic() < deadline, f"the {kind} front did not answer"
            time.sleep(0.2)
        yield url
    finally:
        stop_process(proc)


def requests_seen(folder: Path, kind: str) -> list[dict[str, Any]]:
    """The requests the front of ``kind`` logged in ``folder``, in order."""
    path = folder / f"{kind}-requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("vllm", "sglang"), required=True)
    parser.add_argument("--engine", required=True, help="the llama-server's base URL")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, default=None)
    args = parser.parse_args()
    uvicorn.run(
        build_app(args.kind, args.engine, args.model, args.log),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
