"""The trainer side of the verl bridge test, run by verl's own environment's Python
(scripts/setup_trainers.sh): verl 0.9.1's agent-loop machinery with rolloutd sessions.

What is verl's and what is not:

- ``hydra.utils.instantiate`` on verl's agent-loop registry entry ``rolloutd`` builds
  :class:`RolloutdAgentLoop` with the arguments verl's ``AgentLoopWorker._run_agent_loop``
  passes (trainer config, server manager, tokenizer, processor, dataset class, data config,
  tools); its ``run`` returns verl's ``AgentLoopOutput``, whose own ``as_dict`` gives the
  tensors verl trains on; ``to_data_proto`` builds verl's ``DataProto``.
- The server manager is :class:`LlamaServerManager`, a subclass of verl's
  ``LLMServerClient`` whose ``generate`` sends the prompt ids to a real engine, llama-server,
  and answers verl's ``TokenOutput``: **a real engine behind verl's server interface**,
  standing in for verl's vLLM/SGLang replicas (they need a GPU). verl's load balancer (a
  Ray actor) is not used: ``generate`` is overridden whole, as verl's own
  ``FullyAsyncLLMServerClient`` overrides it.

Protocol with the test (stdout, one JSON object per line): ``{"endpoint": url}`` once the
server manager's endpoint serves, then it waits for one line on stdin (the fleets are up),
runs the prompts, and prints ``{"outputs": [...], "calls": [...], "stats": {...},
"data_proto": {...}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import httpx


def make_server_manager(engine_url: str, calls: list[dict[str, Any]]):
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import TokenOutput

    class LlamaServerManager(LLMServerClient):
        """verl's server-manager interface answered by llama-server (a real engine)."""

        def __init__(self, config: Any) -> None:
            super().__init__(config, load_balancer_handle=None)
            self.http = httpx.AsyncClient(base_url=engine_url, timeout=600)

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            body = {
                "prompt": list(prompt_ids),
                "n_predict": int(sampling_params.get("max_tokens", 64)),
                "temperature": float(sampling_params.get("temperature", 1.0)),
                "top_p": float(sampling_params.get("top_p", 1.0)),
                "top_k": max(int(sampling_params.get("top_k", -1)), 0),
                "n_probs": 1,
                "post_sampling_probs": False,
                "cache_prompt": False,
                "return_tokens": True,
            }
            if sampling_params.get("seed") is not None:
                body["seed"] = int(sampling_params["seed"])
            answer = (await self.http.post("/completion", json=body)).raise_for_status().json()
            probs = answer["completion_probabilities"]
            output = TokenOutput(
                token_ids=[int(p["id"]) for p in probs],
                log_probs=[float(p["logprob"]) for p in probs],
                stop_reason="completed",
            )
            calls.append(
                {
                    "prompt_ids": list(prompt_ids),
                    "token_ids": output.token_ids,
                    "log_probs": output.log_probs,
                }
            )
            return output

    return LlamaServerManager


async def main(args: argparse.Namespace) -> None:
    import hydra
    import structlog
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopOutput,
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from rolloutd.trainer_client import RolloutClient
    from rolloutd.trainer_client.bridges.verl import (
        AGENT_NAME,
        RolloutdAgentLoop,
        ServerManagerEndpoint,
        to_data_proto,
    )

    # stdout carries the protocol: rolloutd's logs go to stderr
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"name": "vllm", "prompt_length": 4096, "response_length": 512}
            },
            "data": {"apply_chat_template_kwargs": {}},
        }
    )
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    calls: list[dict[str, Any]] = []
    server_manager = make_server_manager(args.engine_url, calls)(config)
    endpoint = ServerManagerEndpoint(server_manager, tokenizer, context_size=8192)
    print(json.dumps({"endpoint": await endpoint.start()}), flush=True)
    await asyncio.to_thread(sys.stdin.readline)

    client = await RolloutClient.connect(
        args.temporal, namespace=args.namespace, store_url=args.store
    )
    RolloutdAgentLoop.configure(client, task_prefix=args.task_prefix)
    task = json.loads(args.task)
    failing = json.loads(args.failing_task) if args.failing_task else None

    async def one(word: str, fields: dict[str, Any]) -> AgentLoopOutput:
        loop = hydra.utils.instantiate(
            config=_agent_loop_registry[AGENT_NAME],
            trainer_config=DictConfigWrap(config=config),
            server_manager=server_manager,
            tokenizer=tokenizer,
            processor=None,
            hf_model_type=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap([]),
        )
        assert isinstance(loop, RolloutdAgentLoop)
        return await loop.run(
            {"temperature": 1.0, "top_p": 1.0},
            raw_prompt=[{"role": "user", "content": f"Name a {word}. One word."}],
            extra_info={"rolloutd_task": fields},
        )

    # the rows, then (with --failing-task) one more whose session fails
    rows_in = [(word, task) for word in args.words] + ([("metal", failing)] if failing else [])
    outputs = await asyncio.gather(*(one(word, fields) for word, fields in rows_in))
    rows = []
    for output in outputs:
        tensors = output.as_dict()  # verl's own conversion to training tensors
        rows.append(
            {
                "output": output.model_dump(mode="json"),
                "as_dict": {
                    "prompts": [str(tensors["prompts"].dtype), list(tensors["prompts"].shape)],
                    "responses": [
                        str(tensors["responses"].dtype),
                        list(tensors["responses"].shape),
                    ],
                    "response_mask": tensors["response_mask"].tolist(),
                    "rollout_log_probs": tensors["rollout_log_probs"].tolist(),
                    "rm_scores": tensors["rm_scores"].tolist(),
                },
            }
        )
    sessions = [o.extra_fields.get("rolloutd_session_id") for o in outputs]
    trajectories = []
    for task_id in [o.extra_fields["rolloutd_task_id"] for o in outputs]:
        group = await client.result(task_id)
        trajectories += [client.trajectory(s) for s in group.sessions]
    # to_verl_batch leaves the failed session out
    proto = to_data_proto(trajectories, pad_token_id=tokenizer.pad_token_id or 0)
    print(
        json.dumps(
            {
                "outputs": rows,
                "sessions": sessions,
                "calls": calls,
                "stats": RolloutdAgentLoop.stats.as_dict(),
                "data_proto": {
                    "len": len(proto),
                    "keys": sorted(proto.batch.keys()),
                    "uid": list(proto.non_tensor_batch["uid"]),
                    "token_level_scores_sum": proto.batch["token_level_scores"].sum(-1).tolist(),
                },
            }
        ),
        flush=True,
    )
    await endpoint.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--temporal", required=True)
    parser.add_argument("--namespace", default="default", help="the fleets' Temporal namespace")
    parser.add_argument("--store", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--task", required=True, help="task fields, JSON")
    parser.add_argument("--task-prefix", default="verl")
    parser.add_argument("--words", nargs="+", required=True)
    parser.add_argument("--failing-task", default=None, help="task fields of one more row, JSON")
    asyncio.run(main(parser.parse_args()))
