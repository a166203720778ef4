"""Small configs of model types without a native family, for the generic reader and recipe tests.

Each is transformers' default config of the type with its sizes shrunk (kept consistent), so
that building and tracing it is quick; the structure (layer kinds, mixers, experts, towers,
shared blocks) is the type's own.
"""

from __future__ import annotations

import json
from typing import Any

#: model_type -> overrides of transformers' default config.
SMALL: dict[str, dict[str, Any]] = {
    "qwen3_5_moe_text": {
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 96,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "vocab_size": 128,
    },
    "mamba2": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "state_size": 16,
        "expand": 2,
        "head_dim": 16,
        "num_heads": 8,
        "n_groups": 1,
        "vocab_size": 128,
    },
    "zamba2": {
        "hidden_size": 64,
        "num_hidden_layers": 6,
        "layers_block_type": ["linear_attention", "linear_attention", "hybrid"] * 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "attention_head_dim": 16,
        "intermediate_size": 96,
        "mamba_d_state": 16,
        "mamba_headdim": 16,
        "n_mamba_heads": 8,
        "vocab_size": 128,
        "num_mem_blocks": 1,
    },
}


def small_config(model_type: str) -> dict[str, Any]:
    """The small config as a ``config.json`` holds it (built by transformers, then dumped)."""
    import transformers

    config = transformers.AutoConfig.for_model(model_type, **SMALL[model_type]).to_dict()
    config["model_type"] = model_type
    return json.loads(json.dumps(config, default=str))


#: Types without a native family whose recipe-based estimates are checked against the simulator
#: (tests/simulator/test_recipe_agreement.py): transformers' default config with 4 layers (the
#: layer pattern of each kept), one or more of each kind of architecture: dense decoders with
#: every position scheme (rotary, partial rotary, ALiBi, learned), parallel blocks, MoE, hybrids
#: with convolution or linear-attention layers.
AGREEMENT_TYPES: tuple[str, ...] = (
    "lfm2",
    "olmo3",
    "exaone4",
    "granite",
    "granitemoe",
    "stablelm",
    "persimmon",
    "bloom",
    "mpt",
    "opt",
    "gptj",
    "codegen",
    "bitnet",
    "apertus",
    "seed_oss",
    "minimax",
)


def four_layer_config(model_type: str) -> dict[str, Any]:
    """transformers' default config of ``model_type`` with 4 decoder layers, as a config.json holds it."""
    import transformers

    config = transformers.AutoConfig.for_model(model_type, num_hidden_layers=4).to_dict()
    config["model_type"] = model_type
    return json.loads(json.dumps(config, default=str))
