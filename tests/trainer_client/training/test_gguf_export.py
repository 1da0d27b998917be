"""GGUF export without an engine: the Q/K permutation is the inverse of the one transformers
undoes when it reads a llama GGUF, and an export of the catalog GGUF's own (dequantized) weights
reproduces its tensors within F16 rounding and keeps its tokenizer and chat template."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from rolloutd.errors import ConfigError  # noqa: E402
from rolloutd.trainer_client.training.gguf_export import export_gguf, permute_qk  # noqa: E402


def test_permute_qk_undoes_transformers_reverse_permutation() -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rng = np.random.default_rng(0)
    processor = LlamaTensorProcessor()
    for num_heads, num_kv_heads, rows in ((9, 9, 576), (9, 3, 192)):
        gguf_layout = rng.standard_normal((rows, 16)).astype(np.float32)
        hf_layout = processor._reverse_permute_weights(gguf_layout, num_heads, num_kv_heads)
        assert not np.array_equal(hf_layout, gguf_layout)
        assert np.array_equal(permute_qk(hf_layout, num_kv_heads), gguf_layout)


@pytest.fixture(scope="module")
def template() -> Path:
    from rolloutd.engine.models import pull_model

    try:
        return pull_model("smollm2-135m").gguf
    except ConfigError as e:
        pytest.skip(f"SmolLM2 GGUF not installed: {e}")


@pytest.fixture(scope="module")
def state(template: Path) -> dict[str, np.ndarray]:
    return hf_state_dict(template)


def hf_state_dict(template: Path) -> dict[str, np.ndarray]:
    """The template's weights under Hugging Face names and layout, read the way transformers
    reads them (dequantized, Q/K permutation undone)."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    reader = gguf.GGUFReader(str(template))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30)
    to_hf = {}
    for hf in ["model.embed_tokens", "model.norm"] + [
        f"model.layers.{i}.{part}"
        for i in range(30)
        for part in (
            "input_layernorm",
            "post_attention_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    ]:
        to_hf[names.get_name(hf)] = hf
    processor = LlamaTensorProcessor(config={"num_attention_heads": 9, "num_key_value_heads": 3})
    out = {}
    for tensor in reader.tensors:
        weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        name = tensor.name.removesuffix(".weight")
        out[to_hf[name] + ".weight"] = processor.process(weights, tensor.name).weights
    return out


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_export_reproduces_the_templates_tensors_and_tokenizer(
    template: Path, state: dict[str, np.ndarray], tmp_path: Path, dtype: str
) -> None:
    out = export_gguf(state, template, tmp_path / "policy.gguf", dtype=dtype)
    source, written = gguf.GGUFReader(str(template)), gguf.GGUFReader(str(out))
    for key in (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.chat_template",
        "tokenizer.ggml.eos_token_id",
        "llama.rope.freq_base",
    ):
        assert written.fields[key].contents() == source.fields[key].contents(), key
    assert written.fields["general.file_type"].contents() == (
        gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16
    )
    expected = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in source.tensors}
    assert {t.name for t in written.tensors} == set(expected)
    for tensor in written.tensors:
        values = np.asarray(tensor.data, dtype=np.float32).reshape(expected[tensor.name].shape)
        np.testing.assert_allclose(
            values, expected[tensor.name], rtol=1e-3, atol=1e-4, err_msg=tensor.name
        )


def test_export_refuses_weights_that_do_not_fit_the_template(
    template: Path, state: dict[str, np.ndarray], tmp_path: Path
) -> None:
    missing = {k: v for k, v in state.items() if k != "model.layers.3.mlp.up_proj.weight"}
    with pytest.raises(ConfigError, match="lack"):
        export_gguf(missing, template, tmp_path / "a.gguf")
    misshapen = {**state, "model.norm.weight": np.ones(7, dtype=np.float32)}
    with pytest.raises(ConfigError, match="shape"):
        export_gguf(misshapen, template, tmp_path / "b.gguf")
    assert list(tmp_path.iterdir()) == []  # nothing half-written is left behind
    with pytest.raises(ConfigError, match="dtype"):
        export_gguf(state, template, tmp_path / "c.gguf", dtype="bf16")
