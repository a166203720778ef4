"""Small synthetic configs, one or more per supported model_type, shared by the parser tests
and the transformers parity test. Each exercises the family's distinctive keys."""

from __future__ import annotations

from typing import Any

_BASE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "torch_dtype": "bfloat16",
}


def _cfg(model_type: str, **overrides: Any) -> dict[str, Any]:
    return {**_BASE, "model_type": model_type, **overrides}


FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": _cfg("llama", tie_word_embeddings=False),
    "llama-biases": _cfg("llama", attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    "mistral-window-headdim": _cfg("mistral", sliding_window=32, head_dim=24),
    "mixtral": _cfg("mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "qwen2-sliding": _cfg(
        "qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=1, tie_word_embeddings=True
    ),
    "qwen2_moe": _cfg(
        "qwen2_moe",
        num_hidden_layers=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        decoder_sparse_step=2,
        mlp_only_layers=[2],
    ),
    "qwen3": _cfg("qwen3", head_dim=32, tie_word_embeddings=True),
    "qwen3_moe": _cfg(
        "qwen3_moe", head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[0]
    ),
    "olmo2": _cfg("olmo2", tie_word_embeddings=False),
    "gemma": _cfg("gemma", head_dim=32, num_key_value_heads=1),
    "gemma2": _cfg(
        "gemma2",
        num_hidden_layers=4,
        head_dim=32,
        sliding_window=16,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
    ),
    "gemma3_text": _cfg("gemma3_text", num_hidden_layers=6, head_dim=32, sliding_window=16),
    "gemma3": {
        "model_type": "gemma3",
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 64,
            "intermediate_size": 160,
            "num_hidden_layers": 6,
            "head_dim": 32,
            "vocab_size": 300,
            "sliding_window": 16,
        },
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 28,
            "patch_size": 14,
            "vision_use_head": False,
        },
        "mm_tokens_per_image": 4,
    },
    "phi": _cfg("phi", partial_rotary_factor=0.5, num_key_value_heads=4),
    "phi-qk-layernorm": _cfg("phi", qk_layernorm=True, num_key_value_heads=4),
    "phi3": _cfg("phi3", sliding_window=32, pad_token_id=0, bos_token_id=0, eos_token_id=0),
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "vocab_size": 100},
    "gpt_neox": _cfg("gpt_neox", num_key_value_heads=4, rotary_pct=0.25, use_parallel_residual=True),
    "falcon-new": {
        "model_type": "falcon",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_kv_heads": 2,
        "new_decoder_architecture": True,
        "vocab_size": 100,
    },
    "falcon-mqa": {
        "model_type": "falcon",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "multi_query": True,
        "parallel_attn": True,
        "new_decoder_architecture": False,
        "vocab_size": 100,
    },
    "falcon-sequential": {
        "model_type": "falcon",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "multi_query": False,
        "parallel_attn": False,
        "bias": True,
        "vocab_size": 100,
        "ffn_hidden_size": 96,
    },
    "starcoder2": _cfg("starcoder2", use_bias=True, sliding_window=32),
    "deepseek_v2": _cfg(
        "deepseek_v2",
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        n_shared_experts=2,
        first_k_dense_replace=1,
    ),
    "deepseek_v3": _cfg(
        "deepseek_v3",
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=2,
        topk_group=1,
    ),
    "gpt_oss": _cfg(
        "gpt_oss",
        intermediate_size=32,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=16,
    ),
    "gpt_oss-layer-types": _cfg(
        "gpt_oss",
        num_hidden_layers=4,
        intermediate_size=48,
        num_key_value_heads=1,
        num_experts=8,
        num_experts_per_tok=3,
        sliding_window=8,
        attention_bias=False,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
    ),
    "olmoe": _cfg("olmoe", intermediate_size=32, num_experts=4, num_experts_per_tok=2, pad_token_id=0, eos_token_id=0),
    "olmoe-clip-norm-topk": _cfg(
        "olmoe",
        intermediate_size=24,
        num_key_value_heads=4,
        num_experts=8,
        num_experts_per_tok=2,
        clip_qkv=8.0,
        norm_topk_prob=True,
        attention_bias=True,
        pad_token_id=0,
        eos_token_id=0,
    ),
    "smollm3": _cfg("smollm3", num_hidden_layers=4, pad_token_id=0, bos_token_id=0, eos_token_id=0),
    "smollm3-nope-sliding": _cfg(
        "smollm3",
        num_hidden_layers=4,
        no_rope_layers=[1, 0, 1, 0],
        use_sliding_window=True,
        sliding_window=16,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    ),
    "cohere2": _cfg("cohere2", num_hidden_layers=4, sliding_window=16, pad_token_id=0, bos_token_id=0, eos_token_id=0),
    "glm4_moe": _cfg(
        "glm4_moe",
        head_dim=32,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        n_shared_experts=1,
        first_k_dense_replace=1,
        attention_bias=True,
        use_qk_norm=True,
        n_group=2,
        topk_group=1,
    ),
    "glm4_moe-two-shared": _cfg(
        "glm4_moe",
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        n_shared_experts=2,
        first_k_dense_replace=2,
        partial_rotary_factor=0.25,
        num_nextn_predict_layers=1,
    ),
}

#: Legacy custom-code Falcon configs and the native keys transformers reads for them.
LEGACY_FALCON: dict[str, Any] = {
    "model_type": "RefinedWeb",
    "hidden_size": 64,
    "n_layer": 2,
    "n_head": 8,
    "n_head_kv": 2,
    "vocab_size": 100,
    "parallel_attn": True,
    "bias": False,
}


def native_falcon(config: dict[str, Any]) -> dict[str, Any]:
    """Translate a RefinedWeb/RefinedWebModel config to transformers' FalconConfig keys,
    as the Hub's conversion of the tiiuae repositories did."""
    native = {
        k: v for k, v in config.items() if k not in {"n_head", "n_layer", "n_head_kv", "auto_map", "architectures"}
    }
    native["model_type"] = "falcon"
    native["num_attention_heads"] = config["n_head"]
    native["num_hidden_layers"] = config["n_layer"]
    if config["model_type"] == "RefinedWeb":
        native["new_decoder_architecture"] = True
        native["num_kv_heads"] = config.get("n_head_kv", config["n_head"])
    return native


# ---- multimodal and nested-config families (issue 19, F2) -------------------------------------

_LLAMA4_TEXT: dict[str, Any] = _cfg(
    "llama4_text",
    intermediate_size=32,
    intermediate_size_mlp=96,
    num_hidden_layers=4,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=1,
    interleave_moe_layer_step=2,
    attention_chunk_size=16,
)
_PIXTRAL: dict[str, Any] = {
    "model_type": "pixtral",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 56,
    "patch_size": 14,
    "head_dim": 8,
}
_QWEN_VISION: dict[str, Any] = {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 4}

MULTIMODAL_CONFIGS: dict[str, dict[str, Any]] = {
    "llama4_text": _LLAMA4_TEXT,
    "llama4": {
        "model_type": "llama4",
        "torch_dtype": "bfloat16",
        "text_config": _LLAMA4_TEXT,
        "vision_config": {
            "model_type": "llama4_vision_model",
            "hidden_size": 32,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 28,
            "patch_size": 14,
            "projector_input_dim": 64,
            "projector_output_dim": 64,
            "vision_output_dim": 64,
            "pixel_shuffle_ratio": 0.5,
        },
    },
    "qwen2_5_vl": {
        "model_type": "qwen2_5_vl",
        "torch_dtype": "bfloat16",
        "text_config": _cfg("qwen2_5_vl_text", rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        "vision_config": {**_QWEN_VISION, "out_hidden_size": 64, "fullatt_block_indexes": [1], "window_size": 28},
    },
    "qwen2_5_vl-flat-tied-sliding": {
        **_cfg(
            "qwen2_5_vl",
            tie_word_embeddings=True,
            use_sliding_window=True,
            sliding_window=16,
            max_window_layers=1,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        ),
        "vision_config": {**_QWEN_VISION, "out_hidden_size": 64, "in_chans": 3, "spatial_patch_size": 14},
    },
    "qwen3_vl": {
        "model_type": "qwen3_vl",
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": True,
        "text_config": _cfg("qwen3_vl_text", head_dim=32),
        "vision_config": {**_QWEN_VISION, "out_hidden_size": 64, "deepstack_visual_indexes": [0, 1]},
    },
    "qwen3_vl_moe": {
        "model_type": "qwen3_vl_moe",
        "torch_dtype": "bfloat16",
        "text_config": _cfg(
            "qwen3_vl_moe_text",
            num_hidden_layers=4,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            decoder_sparse_step=2,
        ),
        "vision_config": {**_QWEN_VISION, "out_hidden_size": 64, "deepstack_visual_indexes": [1]},
    },
    "mistral3": {
        "model_type": "mistral3",
        "torch_dtype": "bfloat16",
        "text_config": _cfg("mistral", head_dim=24),
        "vision_config": _PIXTRAL,
        "multimodal_projector_bias": True,
        "vision_feature_layer": [-1, -2],
    },
    "mistral3-ministral3": {
        "model_type": "mistral3",
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "text_config": _cfg("ministral3", head_dim=16, tie_word_embeddings=False),
        "vision_config": _PIXTRAL,
    },
    "ministral3": _cfg("ministral3"),
}
FAMILY_CONFIGS.update(MULTIMODAL_CONFIGS)


#: The hybrids with a per-sequence state (issue 19): Mamba 1 / Mamba 2 / gated DeltaNet beside attention.
HYBRID_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3_next": _cfg(
        "qwen3_next",
        num_hidden_layers=5,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention", "linear_attention"],
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        mlp_only_layers=[2],
    ),
    "jamba": _cfg(
        "jamba",
        num_hidden_layers=5,
        attn_layer_period=3,
        attn_layer_offset=0,
        expert_layer_period=2,
        expert_layer_offset=0,
        num_experts=4,
        num_experts_per_tok=2,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
    ),
    "falcon_h1": _cfg(
        "falcon_h1",
        num_hidden_layers=2,
        mamba_d_ssm=96,
        mamba_n_heads=6,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_chunk_size=16,
        mamba_rms_norm=True,
    ),
    "falcon_h1-no-mamba-norm": _cfg(
        "falcon_h1",
        num_hidden_layers=2,
        mamba_d_ssm=96,
        mamba_n_heads=6,
        mamba_d_state=16,
        mamba_chunk_size=16,
        mamba_rms_norm=False,
        projectors_bias=True,
    ),
    "nemotron_h": _cfg(
        "nemotron_h",
        hybrid_override_pattern="M*M-E*",
        head_dim=16,
        mamba_num_heads=4,
        mamba_head_dim=16,
        n_groups=2,
        ssm_state_size=16,
        chunk_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48,
    ),
    "granitemoehybrid": _cfg(
        "granitemoehybrid",
        num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "attention"],
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=48,
        mamba_n_heads=4,
        mamba_d_state=16,
        mamba_chunk_size=16,
        position_embedding_type="rope",
    ),
}
FAMILY_CONFIGS.update(HYBRID_CONFIGS)

#: More shapes of the hybrid families, checked for parameter parity only.
HYBRID_VARIANTS: dict[str, dict[str, Any]] = {
    "falcon_h1-biases": {
        **HYBRID_CONFIGS["falcon_h1"],
        "projectors_bias": True,
        "mamba_proj_bias": True,
        "attention_bias": True,
        "mlp_bias": True,
        "mamba_conv_bias": False,
    },
    "falcon_h1-d-ssm-null": {**HYBRID_CONFIGS["falcon_h1"], "mamba_d_ssm": None, "mamba_n_heads": 8},
    "nemotron_h-biases": {**HYBRID_CONFIGS["nemotron_h"], "mlp_bias": True, "use_bias": True, "use_conv_bias": False},
    "nemotron_h-block-list": {
        **{k: v for k, v in HYBRID_CONFIGS["nemotron_h"].items() if k != "hybrid_override_pattern"},
        "layers_block_type": ["mamba", "attention", "moe", "mlp", "mamba"],
    },
    "granitemoehybrid-dense-nope": {
        **HYBRID_CONFIGS["granitemoehybrid"],
        "num_hidden_layers": 3,
        "layer_types": ["mamba", "attention", "mamba"],
        "num_local_experts": 0,
        "position_embedding_type": None,
    },
    "qwen3_next-dense": {**HYBRID_CONFIGS["qwen3_next"], "num_experts": 0},
    "qwen3_next-interval": {
        **{k: v for k, v in HYBRID_CONFIGS["qwen3_next"].items() if k != "layer_types"},
        "num_hidden_layers": 6,
        "full_attention_interval": 3,
        "decoder_sparse_step": 2,
        "attention_bias": True,
    },
    "jamba-one-expert": {**HYBRID_CONFIGS["jamba"], "num_experts": 1, "mamba_proj_bias": True, "mamba_dt_rank": 6},
    **{f"{model_type}-defaults": {"model_type": model_type} for model_type in HYBRID_CONFIGS if "-" not in model_type},
}
