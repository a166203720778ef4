"""Parsers of gpt_oss, olmoe, smollm3, cohere2 and glm4_moe: layer layouts and counts worked out by hand.

Every config here is also built by transformers on the meta device in test_hf_parity.py (to the
parameter); these tests pin what the layouts mean: which layers slide, which skip rotary
embeddings, which are MoE, and the defaults each transformers config class applies.
"""

from __future__ import annotations

import pytest

from family_configs import FAMILY_CONFIGS
from vramlens.model.families import parse_config
from vramlens.model.quantization import QuantMethod
from vramlens.model.spec import FfnKind, NormKind, QKNorm


def test_gpt_oss_by_hand() -> None:
    spec = parse_config(FAMILY_CONFIGS["gpt_oss"])
    # layer_types default: sliding on even indices, full on odd; sliding_window 16.
    assert [layer.window for layer in spec.layers] == [16, None, 16]
    assert all(layer.ffn is FfnKind.MOE for layer in spec.layers) and spec.mlp is None
    h, q, kv, experts, width = 64, 4 * 16, 2 * 16, 4, 32
    attention = (h * q + q) + 2 * (h * kv + kv) + (q * h + h) + 4  # biased q/k/v/o + one sink per head
    expert = 2 * (h * width + width) + (width * h + h)  # gate/up and down with biases
    router = h * experts + experts
    breakdown = spec.parameter_breakdown
    assert breakdown.attention == 3 * attention
    assert breakdown.moe_experts == 3 * experts * expert
    assert breakdown.moe_router == 3 * router
    # Active: top-2 of 4 experts; the two idle experts of every layer drop out.
    assert spec.active_parameters == spec.num_parameters - 3 * 2 * expert


def test_gpt_oss_default_is_the_120b_shape_with_every_default_recorded() -> None:
    spec = parse_config({"model_type": "gpt_oss"})
    assert (spec.hidden_size, spec.num_layers, spec.moe and spec.moe.num_experts) == (2880, 36, 128)
    assert spec.num_parameters == 116_829_156_672
    recorded = " ".join(spec.assumptions)
    for key in ("hidden_size", "num_hidden_layers", "num_local_experts", "sliding_window", "head_dim"):
        assert f"'{key}'" in recorded, key


@pytest.mark.parametrize("value", [None, "null-kv"])
def test_gpt_oss_null_keys_mean_what_the_config_class_makes_of_them(value: str | None) -> None:
    config = dict(FAMILY_CONFIGS["gpt_oss"])
    if value is None:
        config["sliding_window"] = None
        config["layer_types"] = ["full_attention"] * 3
        assert all(layer.window is None for layer in parse_config(config).layers)
    else:
        config["num_key_value_heads"] = None  # GptOssConfig.__post_init__: num_attention_heads
        assert parse_config(config).num_kv_heads == 4


def test_gpt_oss_mxfp4_checkpoint() -> None:
    config = {**FAMILY_CONFIGS["gpt_oss"], "quantization_config": {"quant_method": "mxfp4"}}
    spec = parse_config(config)
    assert spec.quantization is not None and spec.quantization.method is QuantMethod.MXFP4
    assert any("MXFP4 experts" in note for note in spec.assumptions)


def test_olmoe_layout() -> None:
    spec = parse_config(FAMILY_CONFIGS["olmoe-clip-norm-topk"])
    assert spec.attention.qk_norm is QKNorm.PER_PROJECTION and spec.attention.clip_qkv
    assert spec.moe is not None and spec.moe.shared_intermediate_size == 0
    # q_norm over hidden_size (64), k_norm over kv_heads x head_dim (4 x 16).
    h = 64
    projections = 4 * (h * h + h)  # q, k, v, o with attention_bias, MHA
    assert spec.parameter_breakdown.attention == 3 * (projections + h + 64)


def test_olmoe_refuses_a_head_dim_its_q_norm_cannot_normalize() -> None:
    from vramlens.errors import ConfigError

    with pytest.raises(ConfigError, match="key 'head_dim' must be hidden_size / num_attention_heads = 16"):
        parse_config({**FAMILY_CONFIGS["olmoe"], "head_dim": 32})


def test_smollm3_nope_layers() -> None:
    default = parse_config(FAMILY_CONFIGS["smollm3"])
    assert [layer.rope for layer in default.layers] == [True, True, True, False]  # no_rope_layer_interval 4
    assert all(layer.window is None for layer in default.layers)
    sliding = parse_config(FAMILY_CONFIGS["smollm3-nope-sliding"])
    assert [layer.rope for layer in sliding.layers] == [True, False, True, False]
    # use_sliding_window: the NoPE layers are the sliding ones.
    assert [layer.window for layer in sliding.layers] == [None, 16, None, 16]


def test_cohere2_layout() -> None:
    spec = parse_config(FAMILY_CONFIGS["cohere2"])
    assert spec.parallel_residual and spec.norms_per_layer == 1
    assert spec.norm.kind is NormKind.LAYERNORM and not spec.norm.bias
    # sliding_window_pattern 4: three sliding layers with RoPE, then a full NoPE layer.
    assert [(layer.window, layer.rope) for layer in spec.layers] == [(16, True)] * 3 + [(None, False)]
    assert spec.tie_word_embeddings
    # head_dim is hidden // heads whatever the config says (Cohere2Config.__post_init__).
    assert parse_config({**FAMILY_CONFIGS["cohere2"], "head_dim": 99}).head_dim == 16


def test_glm4_moe_layout_and_mtp_note() -> None:
    spec = parse_config(FAMILY_CONFIGS["glm4_moe-two-shared"])
    assert [layer.ffn for layer in spec.layers] == [FfnKind.DENSE, FfnKind.DENSE, FfnKind.MOE]
    assert spec.moe is not None and spec.moe.shared_intermediate_size == 2 * 16 and spec.moe.router_score_bias
    assert spec.position.rotary_fraction == 0.25
    assert not spec.attention.out_bias
    assert any("multi-token-prediction" in note for note in spec.assumptions)
    assert spec.parameter_breakdown.persistent_buffers == 4  # one score-correction bias per expert, one MoE layer
    default = parse_config({"model_type": "glm4_moe"})
    assert default.head_dim == 4096 // 96  # Glm4MoeAttention's floor division, recorded
    assert any("hidden_size // num_attention_heads = 42" in note for note in default.assumptions)
