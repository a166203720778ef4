"""What torch.compile keeps for backward: one transformers Llama decoder layer compiled with
Inductor on CPU, its saved tensors counted with ``saved_tensors_hooks``, against the
estimator's ``compile: true`` recipe.

AOTAutograd's min-cut partitioner decides what is saved; it runs before Inductor's
device-specific code generation, so the CPU answer is the CUDA answer. Counting the
difference between batch 4 and batch 2 leaves out tensors that do not grow with the
batch (the rotary tables, shared by all layers and counted outside them).
"""

from __future__ import annotations

import shutil

import pytest

from conftest import requires_hf
from vramlens.estimator.activations import layer_saved_parts
from vramlens.estimator.layout import lora_targets
from vramlens.estimator.recompute import layer_recipe, train_state
from vramlens.model.resolve import model_from_config
from vramlens.resolve.context import resolve_training
from vramlens.workload.load import load_workload

pytestmark = [
    requires_hf,
    pytest.mark.hf,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # torch.jit internals imported by Inductor
    pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor on CPU needs a C++ compiler"),
]

_CONFIG = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
_SEQ = 256


def _compiled_layer_bytes(dtype_name: str, batch: int, layer, rotary) -> int:
    import torch

    dtype = getattr(torch, dtype_name)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    x = torch.randn(batch, _SEQ, _CONFIG["hidden_size"], dtype=dtype, requires_grad=True)
    cos, sin = rotary(x, torch.arange(_SEQ).unsqueeze(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, position_embeddings=(cos, sin), attention_mask=None)
    return sum(saved.values())


def _measured_per_token(dtype_name: str) -> float:
    import torch
    import transformers

    torch.manual_seed(0)
    config = dict(_CONFIG)
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    hf_config._attn_implementation = "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=getattr(torch, dtype_name))
    model.train()
    layer = torch.compile(model.model.layers[0])
    rotary = model.model.rotary_emb
    double = _compiled_layer_bytes(dtype_name, 4, layer, rotary)
    single = _compiled_layer_bytes(dtype_name, 2, layer, rotary)
    return (double - single) / (2 * _SEQ)


def _estimated_per_token(precision: str) -> float:
    spec = model_from_config(_CONFIG, name="tiny")
    workload = load_workload(
        {"model": "llama-3.1-8b", "precision": precision, "batch": 2, "seq": _SEQ, "attention": "sdpa", "compile": True}
    )
    ctx = resolve_training(spec, workload)
    recipe = layer_recipe(ctx, train_state(ctx, lora_targets(ctx)), [])
    return sum(part.bytes_per_token for part in layer_saved_parts(recipe, moe_layer=False))


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", "bfloat16"), ("fp32", "float32")])
def test_compiled_layer_keeps_what_the_recipe_says(precision: str, dtype: str) -> None:
    """Inductor keeps the layer input, the normalized inputs, q/k/v, the attention output and
    log-sum-exp, the o_proj output, and the gate, up and down-input intermediates of the MLP:
    one MLP intermediate and the norms' fp32 copies fewer than eager."""
    assert _estimated_per_token(precision) == _measured_per_token(dtype)
