"""The trainer's side of the engine tests: SmolLM2-135M in PyTorch (fp32) beside the catalog
GGUF that llama-server serves, and the chat-templated ids of a probe prompt."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class TrainerModel:
    """``files``: the catalog model's files (``ModelFiles``); ``tokenizer``; ``model``: the same
    weights as a ``transformers`` causal LM in fp32."""

    files: Any
    tokenizer: Any
    model: Any

    def chat_ids(self, content: str) -> list[int]:
        """Token ids of one user turn and the assistant's header (the probe prompt)."""
        return self.tokenizer.encode(
            self.tokenizer.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )

    def start_engine(self, folder: Path) -> Any:
        """Export the model's weights as ``folder/policy-0.gguf`` (the catalog GGUF as template)
        and start llama-server on it (one slot, 2048 tokens, log ``folder/engine.log``): engine
        and trainer start equal. The caller stops it."""
        from rolloutd.engine.server import LlamaServer
        from rolloutd.trainer_client.training.gguf_export import export_gguf

        start = export_gguf(self.model.state_dict(), self.files.gguf, folder / "policy-0.gguf")
        return LlamaServer(
            dataclasses.replace(self.files, gguf=start),
            parallel=1,
            ctx_size=2048,
            log_path=folder / "engine.log",
        ).start(timeout_s=180)


def load_trainer_model(name: str = "smollm2-135m") -> TrainerModel:
    """Seed torch, load the catalog model ``name`` in PyTorch; skips the test when llama-server
    is not built here (the engine half of these tests needs it)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rolloutd.engine.models import load_tokenizer, pull_model
    from rolloutd.engine.server import llama_server_binary
    from rolloutd.errors import ConfigError

    try:
        llama_server_binary()
    except ConfigError as e:
        pytest.skip(f"llama-server not available: {e}")
    torch.manual_seed(0)
    torch.set_num_threads(2)
    files = pull_model(name)
    model = AutoModelForCausalLM.from_pretrained(
        str(files.folder), gguf_file=files.gguf.name, torch_dtype=torch.float32
    )
    return TrainerModel(files, load_tokenizer(name), model)
