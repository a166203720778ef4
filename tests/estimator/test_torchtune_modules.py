"""The torchtune profile counts torchtune's own modules (``torchtune.modules``), not transformers'
classes: hand counts of what differs, on a tiny Llama (no torchtune needed; the recipes themselves
run in test_trainer_torchtune.py)."""

from __future__ import annotations

from typing import Any

import pytest

from vramlens.categories import Category
from vramlens.estimator import estimate
from vramlens.estimator.activations import layer_saved_parts
from vramlens.estimator.recompute import layer_recipe, train_state
from vramlens.model.resolve import model_from_config
from vramlens.resolve.context import resolve_training
from vramlens.workload.load import load_workload

H, HEADS, KV_HEADS, HEAD_DIM, LAYERS, POSITIONS = 256, 8, 2, 32, 4, 4096


def _config(**overrides: Any) -> dict[str, Any]:
    return {
        "model_type": "llama", "hidden_size": H, "intermediate_size": 688, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": 2000,
        "max_position_embeddings": POSITIONS, **overrides,
    }  # fmt: skip


def _workload(framework: str, **extra: Any) -> dict[str, Any]:
    return {"model": model_from_config(_config()), "framework": framework, "precision": "bf16", "batch": 4, "seq": 128,
            "loss": "chunked", "optimizer_impl": "fused", **extra}  # fmt: skip


def _layer_bytes_per_token(framework: str) -> float:
    workload = load_workload(_workload(framework))
    ctx = resolve_training(workload.model, workload)  # type: ignore[arg-type]
    return sum(part.bytes_per_token for part in layer_saved_parts(layer_recipe(ctx, train_state(ctx, frozenset()), [])))


def test_a_torchtune_layer_keeps_fp32_normalized_tensors_and_expanded_keys_and_values() -> None:
    # Full bf16 training. Each of the two norms: F.rms_norm(x.float(), weight=bf16 scale) takes ATen's
    # composite path and keeps the fp32 normalized tensor (4h) where LlamaRMSNorm keeps it in bf16 (2h).
    norms = 2 * (4 * H - 2 * H)
    # MultiHeadAttention expands keys and values to every head before SDPA (HEADS / KV_HEADS copies).
    keys_values = 2 * 2 * (HEADS - KV_HEADS) * HEAD_DIM
    assert _layer_bytes_per_token("torchtune") - _layer_bytes_per_token("hf") == norms + keys_values


@pytest.mark.parametrize(
    ("method", "overrides", "tables"),
    [
        ("full", {}, 1),  # llama3(): one RotaryPositionalEmbeddings shared by every layer
        ("lora", {}, LAYERS),  # lora_llama3_self_attention builds its own per layer
        ("lora", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 1),  # lora_llama3_1 shares one
    ],
)
def test_torchtune_rotary_tables_are_fp32_buffers(method: str, overrides: dict[str, Any], tables: int) -> None:
    workload = _workload("torchtune", method=method)
    workload["model"] = model_from_config(_config(**overrides))
    if method == "lora":
        workload["lora"] = {"rank": 8, "targets": ["q_proj", "v_proj"]}
    report = estimate(workload)
    assert report.peak.breakdown[Category.BUFFERS] == tables * POSITIONS * HEAD_DIM * 4
    assert Category.BUFFERS not in estimate(_workload("hf", method="full")).peak.breakdown
