"""The trainer's weights written as a GGUF the reference engine (llama-server) loads.

Weight sync to the engine moves a file: after an optimizer step the trainer writes its fp32
weights as an F32 GGUF (F16 on request) and asks the engine to load it. The tokenizer, chat
template and every
hyper-parameter are copied unchanged from a template GGUF (the catalog model's), so the engine
renders and tokenizes exactly as before; only the tensors change.

The rule for the tensors is llama.cpp's own converter (``convert_hf_to_gguf.py``, ``LlamaModel``):
Hugging Face names map to GGUF names through ``gguf``'s ``TensorNameMap``; the rows of
``q_proj`` and ``k_proj`` are permuted from Hugging Face's rotary layout (halves) to llama.cpp's
(interleaved pairs); 1-D tensors (norms) stay F32, matrices are F32 or F16. A tied ``lm_head`` is
not
written (llama.cpp reuses ``token_embd`` when ``output.weight`` is absent).

Measured here (SmolLM2-135M): llama-server loads the 514 MB F32 file (F16: 258 MB) in about
a second; the mean absolute difference of its logprobs to PyTorch fp32 on the untrained model is
about 0.001 for F32 and 0.002 for F16 (the catalog's Q4_1 is about 0.07); after training, F16's
grows (see :func:`export_gguf`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import structlog

from rolloutd.errors import ConfigError

log = structlog.get_logger(__name__)

#: architectures whose Q/K rows llama.cpp permutes (its ``LlamaModel`` converter)
_PERMUTED_ARCHS = {"llama"}
#: keys the writer sets itself, or that describe the template's own tensors
_SKIPPED_KEYS = {"general.architecture", "general.file_type", "general.quantization_version"}


def permute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Reorder the rows of a Hugging Face ``q_proj`` / ``k_proj`` weight into llama.cpp's
    rotary layout.

    Hugging Face rotates the two halves of each head's dimensions; llama.cpp rotates adjacent
    pairs. The rule is ``convert_hf_to_gguf.py``'s ``LlamaModel.permute``.

    Args:
        weight: array ``[num_heads * head_dim, hidden]`` (``q_proj``: attention heads;
            ``k_proj``: key-value heads).
        num_heads: heads in ``weight`` (``head_count`` for Q, ``head_count_kv`` for K).

    Returns:
        An array of the same shape.
    """
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _field_value(field: Any) -> tuple[Any, gguf.GGUFValueType, gguf.GGUFValueType | None]:
    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        return field.contents(), vtype, field.types[-1]
    return field.contents(), vtype, None


def export_gguf(
    state_dict: Mapping[str, Any], template: str | Path, out: str | Path, *, dtype: str = "f32"
) -> Path:
    """Write a model's weights as an F32 (or F16) GGUF with a template GGUF's metadata and
    tokenizer.

    F32 is the default because F16 drops training updates. A base model read from a GGUF has
    weights on (or near) the F16 grid, and an Adam step at lr 1e-5 moves most weights by less
    than half an F16 ULP, so F16 rounds the update away and the engine lags the trainer in
    exactly the direction training moved it. Measured on SmolLM2-135M after 3 Adam steps
    (lr 1e-5) toward a reply to the probe prompt: engine vs trainer mean |Δlogprob| 0.038 nats
    for F16, 0.0012 for F32 (``tests/trainer_client/training/test_gguf_precision.py``); in the
    closed loop F16's mismatch grew from 0.0016 to 0.038 over 7 steps (docs/rl_loop.md). F16 halves
    the file and suits a step large enough to cross the grid or weights trained in F16.

    The file is written beside ``out`` and renamed into place, so an engine never loads a
    partial file.

    Args:
        state_dict: Hugging Face parameter name -> tensor (``torch.Tensor`` or array), e.g.
            ``model.state_dict()`` of a ``LlamaForCausalLM``; fp32 or bf16.
        template: a GGUF of the same architecture and shapes (the catalog model's).
        out: the GGUF to write.
        dtype: ``"f32"`` (every tensor F32) or ``"f16"`` (matrices F16, norms F32).

    Returns:
        ``out`` as a ``Path``.

    Raises:
        ConfigError: the template's architecture is not one this exporter knows, a parameter
            has no GGUF name, or a tensor's shape differs from the template's.
    """
    if dtype not in ("f16", "f32"):
        raise ConfigError(f"GGUF export: dtype must be 'f16' or 'f32', not {dtype!r}")
    t0 = time.monotonic()
    reader = gguf.GGUFReader(str(template))
    arch = str(reader.fields["general.architecture"].contents())
    if arch not in _PERMUTED_ARCHS:
        raise ConfigError(f"GGUF export knows the llama architecture only, not {arch!r}")
    num_blocks = int(reader.fields[f"{arch}.block_count"].contents())
    num_heads = int(reader.fields[f"{arch}.attention.head_count"].contents())
    num_kv_heads = int(reader.fields[f"{arch}.attention.head_count_kv"].contents())
    template_shapes = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, num_blocks)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".part", dir=out.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key in _SKIPPED_KEYS:
                continue
            value, vtype, sub_type = _field_value(field)
            writer.add_key_value(key, value, vtype, sub_type=sub_type)
        writer.add_file_type(
            gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32
        )
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for name, array in _gguf_tensors(
            state_dict,
            names,
            num_heads,
            num_kv_heads,
            set(template_shapes),
            np.dtype(dtype.replace("f", "float")),
        ):
            expected = template_shapes[name]
            if tuple(array.shape) != expected:
                raise ConfigError(
                    f"GGUF export: {name} has shape {tuple(array.shape)}, the "
                    f"template has {expected}"
                )
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info(
        "gguf_exported",
        path=str(out),
        num_tensors=len(template_shapes),
        size_bytes=out.stat().st_size,
        duration_s=round(time.monotonic() - t0, 2),
    )
    return out


def _gguf_tensors(
    state_dict: Mapping[str, Any],
    names: gguf.TensorNameMap,
    num_heads: int,
    num_kv_heads: int,
    wanted: set[str],
    matrix_dtype: np.dtype,
) -> Iterable[tuple[str, np.ndarray]]:
    """GGUF name and array of every parameter the template has, in its dtype rule."""
    written: set[str] = set()
    for hf_name, tensor in state_dict.items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ConfigError(f"GGUF export: no GGUF name for parameter {hf_name!r}")
        if name not in wanted:
            if name == "output.weight":  # tied to token_embd in the template
                continue
            raise ConfigError(
                f"GGUF export: the template has no tensor {name!r} (from {hf_name!r})"
            )
        array = _to_numpy(tensor)
        if hf_name.endswith("q_proj.weight"):
            array = permute_qk(array, num_heads)
        elif hf_name.endswith("k_proj.weight"):
            array = permute_qk(array, num_kv_heads)
        # llama.cpp keeps 1-D tensors (norms) in F32: they are small and precision-sensitive
        array = array.astype(np.float32 if array.ndim == 1 else matrix_dtype)
        written.add(name)
        yield name, array
    if missing := wanted - written:
        raise ConfigError(f"GGUF export: the weights lack {sorted(missing)[:5]}")


def _to_numpy(tensor: Any) -> np.ndarray:
    if isinstance(tensor, np.ndarray):
        return tensor.astype(np.float32, copy=False)
    # a torch.Tensor: through fp32, since numpy has no bfloat16
    return tensor.detach().to(device="cpu").float().numpy()
