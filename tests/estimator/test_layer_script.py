"""A LoRA layer's forward in code order (``estimator/layer_script.py``) against the installed
transformers and PEFT.

One decoder layer of a small model of each family, wrapped by PEFT's ``all-linear`` LoRA in bf16,
runs its forward on CPU with grad under ``vramlens.track``; the tensors it makes and frees, in
order, are the script's steps (the per-token statistics, below ``_SMALL`` bytes, are left out on
both sides: the script writes the kept rsqrt and leaves the ``mean`` and ``+ eps`` scalars per token
out). The layer's input and rotary tables are made before tracking starts. The families cover the
script's rules: pre-norm RMS layers (Qwen 2), q/k norms after each projection (Qwen 3, OLMo 2, whose
norms come after attention and MLP), Gemma 3's norms in fp32 with q/k norms after the values and
post-norms, Gemma 2's eager attention with soft-capped scores and keys and values repeated for it.
"""

from __future__ import annotations

from typing import Any

import pytest

from conftest import requires_hf
from vramlens.estimator.layout import param_layout
from vramlens.estimator.quantities import stage_memory
from vramlens.estimator.step_shape import step_shape
from vramlens.model.resolve import model_from_config
from vramlens.resolve.context import resolve_training
from vramlens.workload.load import load_workload

pytestmark = [requires_hf, pytest.mark.hf]

_SEQ = 48
_SMALL = 1024
_BASE = {
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 1,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}
_FAMILIES: dict[str, dict[str, Any]] = {
    "qwen2": {"model_type": "qwen2"},
    "qwen3": {"model_type": "qwen3"},
    "olmo2": {"model_type": "olmo2"},
    "gemma3_text": {"model_type": "gemma3_text", "sliding_window": 512, "layer_types": ["full_attention"]},
    "gemma2": {"model_type": "gemma2", "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
}


def _config(family: str) -> dict[str, Any]:
    return {**_BASE, **_FAMILIES[family]}


def _tracked(family: str) -> list[int]:
    """Signed bytes of every event of one PEFT-wrapped decoder layer's forward with grad."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    import vramlens

    config = dict(_config(family))
    config = AutoConfig.for_model(config.pop("model_type"), **config)
    config._attn_implementation = "eager" if family == "gemma2" else "sdpa"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
    inner = get_peft_model(model, lora).base_model.model.model
    x = torch.randn(1, _SEQ, config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(_SEQ)[None]
    table = ("full_attention",) if family == "gemma3_text" else ()
    cos, sin = inner.rotary_emb(x, positions, *table)
    mask = torch.full((_SEQ, _SEQ), float("-inf"), dtype=torch.bfloat16).triu(1)[None, None]
    with vramlens.track(inputs=[x, cos, sin, mask]) as tracker:
        output = inner.layers[0](
            x,
            attention_mask=mask if family == "gemma2" else None,
            position_embeddings=(cos, sin),
            position_ids=positions,
        )
    del output
    return tracker.timeline().nbytes.tolist()[4:]  # the four registered inputs come first


def _script(family: str) -> list[int]:
    workload = {
        "model": model_from_config(_config(family), name=family),
        "method": "lora",
        "lora": {"rank": 8, "alpha": 16},
        "precision": "bf16",
        "batch": 1,
        "seq": _SEQ,
        "framework": "hf",
        **({"attention": "eager"} if family == "gemma2" else {}),
    }
    resolved = load_workload(workload)
    ctx = resolve_training(resolved.model, resolved)  # type: ignore[arg-type]
    layout = param_layout(ctx)
    shape = step_shape(ctx, stage_memory(ctx, layout.stages[0], layout.targets), layout.targets)
    (script,) = shape.forward_scripts
    assert script is not None, f"{family}: no forward script written"
    made: dict[str, int] = {}
    events = []
    for op, name, nbytes in script.steps:
        if op == "+":
            made[name] = nbytes
        events.append(made[name] if op == "+" else -made[name])
    output = _SEQ * ctx.spec.hidden_size * ctx.compute_bytes  # the residual sum the layer returns
    return [*events, output, *(-made[name] for name in script.released)]


@pytest.mark.parametrize("family", list(_FAMILIES))
def test_lora_layer_script_is_the_real_forward(family: str) -> None:
    tracked = [n for n in _tracked(family) if abs(n) > _SMALL]
    assert [n for n in _script(family) if abs(n) > _SMALL] == tracked
