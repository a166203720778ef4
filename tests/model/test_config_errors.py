"""Malformed configs give one-line errors naming the key (and the file); fuzzing finds no traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from family_configs import FAMILY_CONFIGS
from vramlens.errors import ConfigError, InputError
from vramlens.model.families import parse_config
from vramlens.model.resolve import load_model

LLAMA = FAMILY_CONFIGS["llama"]


def without(config: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != key}


CASES = [
    ("missing hidden_size", without(LLAMA, "hidden_size"), "missing required key 'hidden_size'"),
    ("missing vocab", without(LLAMA, "vocab_size"), "missing required key 'vocab_size'"),
    ("string size", {**LLAMA, "hidden_size": "64"}, "key 'hidden_size' must be an integer >= 1, got '64'"),
    ("negative layers", {**LLAMA, "num_hidden_layers": -2}, "key 'num_hidden_layers' must be an integer >= 1, got -2"),
    ("zero heads", {**LLAMA, "num_attention_heads": 0}, "key 'num_attention_heads' must be an integer >= 1"),
    ("absurd layers", {**LLAMA, "num_hidden_layers": 10**9}, "key 'num_hidden_layers' must be at most 10000"),
    (
        "kv does not divide",
        {**LLAMA, "num_key_value_heads": 3},
        "key 'num_key_value_heads' must divide num_attention_heads (4), got 3",
    ),
    ("bool as int", {**LLAMA, "intermediate_size": True}, "key 'intermediate_size' must be an integer"),
    ("bad bool", {**LLAMA, "tie_word_embeddings": "yes"}, "key 'tie_word_embeddings' must be true or false"),
    ("bad dtype", {**LLAMA, "torch_dtype": "float12"}, "key 'torch_dtype' is not a dtype"),
    (
        "indivisible head dim",
        {**LLAMA, "hidden_size": 66},
        "key 'head_dim' is absent and hidden_size 66 is not divisible",
    ),
    (
        "unknown model type",
        {"model_type": "acme_decoder", "d_model": 64},
        "model_type 'acme_decoder' ",
    ),
    ("no model type", {"d_model": 64}, "missing required key 'model_type'"),
    ("model type not a string", {**LLAMA, "model_type": ["llama"]}, "key 'model_type' must be a non-empty string"),
    (
        "layer_types length",
        {**FAMILY_CONFIGS["gemma2"], "layer_types": ["full_attention"]},
        "key 'layer_types' has 1 entries for 4 layers",
    ),
    (
        "layer_types value",
        {**FAMILY_CONFIGS["gemma2"], "layer_types": ["full_attention", "x", "y", "full_attention"]},
        "key 'layer_types' has unsupported x, y",
    ),
    (
        "nan",
        {**FAMILY_CONFIGS["gemma2"], "final_logit_softcapping": float("nan")},
        "key 'final_logit_softcapping' must be a finite number",
    ),
    (
        "rope factor type",
        {**LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": "8"}},
        "[rope_scaling]: key 'factor' must be a finite number",
    ),
    (
        "top-k > experts",
        {**FAMILY_CONFIGS["mixtral"], "num_experts_per_tok": 9},
        "moe.experts_per_token: must be between 1 and num_experts (4), got 9",
    ),
    (
        "mla rank zero",
        {**FAMILY_CONFIGS["deepseek_v3"], "kv_lora_rank": 0},
        "key 'kv_lora_rank' must be an integer >= 1",
    ),
    ("gemma3 without vision", without(FAMILY_CONFIGS["gemma3"], "vision_config"), "key 'vision_config' is required"),
    (
        "quant method",
        {**LLAMA, "quantization_config": {"quant_method": "hqq"}},
        "quantization_config.quant_method: unsupported 'hqq'; expected one of gptq",
    ),
    (
        "quant bits",
        {**LLAMA, "quantization_config": {"quant_method": "gptq", "bits": 5}},
        "quantization_config.bits: 5 is not supported",
    ),
    ("top level list", [LLAMA], "expected a JSON object, got list"),
    (
        "nemotron_h latent MoE",
        {**FAMILY_CONFIGS["nemotron_h"], "moe_latent_size": 16},
        "key 'moe_latent_size' is set: MoE latent projections are not modelled",
    ),
    (
        "nemotron_h pattern",
        {**FAMILY_CONFIGS["nemotron_h"], "hybrid_override_pattern": "M*X"},
        "key 'hybrid_override_pattern' has ['X']; expected characters M * - E",
    ),
    (
        "nemotron_h block type",
        {**FAMILY_CONFIGS["nemotron_h"], "layers_block_type": ["mamba", "ssm"]},
        "key 'layers_block_type' has unsupported ssm",
    ),
    (
        "jamba attention offset",
        {**FAMILY_CONFIGS["jamba"], "attn_layer_offset": 3},
        "key 'attn_layer_offset' (3) must be smaller than attn_layer_period (3)",
    ),
    (
        "jamba dt rank",
        {**FAMILY_CONFIGS["jamba"], "mamba_dt_rank": "small"},
        "key 'mamba_dt_rank' must be an integer >= 1, got 'small'",
    ),
    (
        "qwen3_next layer type",
        {**FAMILY_CONFIGS["qwen3_next"], "layer_types": ["sliding_attention"] * 5},
        "key 'layer_types' has unsupported sliding_attention; expected linear_attention, full_attention",
    ),
    (
        "qwen3_next value heads",
        {**FAMILY_CONFIGS["qwen3_next"], "linear_num_value_heads": 3},
        "linear_attention.num_value_heads: 3 is not a multiple of the 2 key heads",
    ),
    (
        "falcon_h1 head width",
        {**FAMILY_CONFIGS["falcon_h1"], "mamba_d_head": 10},
        "key 'mamba_d_head' 10 x 6 Mamba heads must equal the Mamba inner width 96",
    ),
    (
        "falcon_h1 groups",
        {**FAMILY_CONFIGS["falcon_h1"], "mamba_n_groups": 4},
        "mamba.n_groups: 4 does not divide the 6 heads",
    ),
    (
        "granitemoehybrid positions",
        {**FAMILY_CONFIGS["granitemoehybrid"], "position_embedding_type": "alibi"},
        "key 'position_embedding_type' must be null or 'rope', got 'alibi'",
    ),
    (
        "granitemoehybrid layer count",
        {**FAMILY_CONFIGS["granitemoehybrid"], "layer_types": ["mamba"]},
        "key 'layer_types' has 1 entries for 4 layers",
    ),
    (
        "gpt_oss layer_types length",
        {**FAMILY_CONFIGS["gpt_oss"], "layer_types": ["full_attention"]},
        "key 'layer_types' has 1 entries for 3 layers",
    ),
    (
        "gpt_oss sliding layers without a window",
        {**FAMILY_CONFIGS["gpt_oss"], "sliding_window": None},
        "key 'sliding_window' must be a positive integer when layers use sliding_attention",
    ),
    (
        "gpt_oss mxfp4 dequantize",
        {**FAMILY_CONFIGS["gpt_oss"], "quantization_config": {"quant_method": "mxfp4", "dequantize": "yes"}},
        "key 'quantization_config.dequantize' must be true or false",
    ),
    (
        "smollm3 no_rope_layers too short",
        {**FAMILY_CONFIGS["smollm3"], "no_rope_layers": [1, 0]},
        "key 'no_rope_layers' has 2 entries for 4 layers",
    ),
    (
        "smollm3 no_rope_layers value",
        {**FAMILY_CONFIGS["smollm3"], "no_rope_layers": [1, 2, 1, 0]},
        "key 'no_rope_layers' must hold 1 (RoPE) or 0 (NoPE) per layer",
    ),
    (
        "cohere2 more heads than hidden",
        {**FAMILY_CONFIGS["cohere2"], "num_attention_heads": 128, "num_key_value_heads": 128},
        "key 'num_attention_heads' must not exceed hidden_size 64",
    ),
    (
        "glm4_moe groups",
        {**FAMILY_CONFIGS["glm4_moe"], "n_group": 3},
        "key 'n_group' must divide n_routed_experts (8), got 3",
    ),
    (
        "olmoe heads",
        {**FAMILY_CONFIGS["olmoe"], "num_attention_heads": 3},
        "key 'num_attention_heads' must divide hidden_size 64",
    ),
]

# Nested (multimodal) configs: a missing part, or a part vramlens would have to guess, names its key.
_L4 = FAMILY_CONFIGS["llama4"]
CASES += [
    ("llama4 without text", without(_L4, "text_config"), "key 'text_config' is required for model_type 'llama4'"),
    ("qwen3_vl without text", without(FAMILY_CONFIGS["qwen3_vl"], "text_config"), "key 'text_config' is required"),
    (
        "qwen2_5_vl without text",
        without(FAMILY_CONFIGS["qwen2_5_vl"], "text_config"),
        "key 'text_config' is required for model_type 'qwen2_5_vl'",
    ),
    (
        "mistral3 without vision",
        without(FAMILY_CONFIGS["mistral3"], "vision_config"),
        "key 'vision_config' is required",
    ),
    ("text_config not an object", {**_L4, "text_config": [1]}, "key 'text_config' must be an object"),
    (
        "text part missing a size",
        {**_L4, "text_config": without(_L4["text_config"], "hidden_size")},
        "[text_config]: missing required key 'hidden_size'",
    ),
    (
        "mistral3 text type",
        {
            **FAMILY_CONFIGS["mistral3"],
            "text_config": {**FAMILY_CONFIGS["mistral3"]["text_config"], "model_type": "gpt2"},
        },
        "[text_config]: key 'model_type' 'gpt2' is not a text decoder vramlens reads for mistral3",
    ),
    (
        "mistral3 vision type",
        {**FAMILY_CONFIGS["mistral3"], "vision_config": {"model_type": "siglip_vision_model"}},
        "[vision_config]: key 'model_type' 'siglip_vision_model' is not a vision tower vramlens reads",
    ),
    (
        "llama4 no_rope_layers short",
        {**FAMILY_CONFIGS["llama4_text"], "no_rope_layers": [1, 0]},
        "key 'no_rope_layers' has 2 entries for 4 layers",
    ),
    (
        "llama4 layer type",
        {**FAMILY_CONFIGS["llama4_text"], "layer_types": ["sliding_attention"] * 4},
        "key 'layer_types' has unsupported sliding_attention; expected chunked_attention, full_attention",
    ),
    (
        "llama4 chunk null",
        {**FAMILY_CONFIGS["llama4_text"], "attention_chunk_size": None},
        "key 'attention_chunk_size' must be a positive integer when layers use chunked attention",
    ),
    (
        "llama4 moe layer outside",
        {**FAMILY_CONFIGS["llama4_text"], "moe_layers": [1, 7]},
        "key 'moe_layers' names layer 7 of a 4-layer model",
    ),
    (
        "qwen vision depth",
        {**FAMILY_CONFIGS["qwen3_vl"], "vision_config": {**FAMILY_CONFIGS["qwen3_vl"]["vision_config"], "depth": 0}},
        "[vision_config]: key 'depth' must be an integer >= 1",
    ),
]


@pytest.mark.parametrize(("label", "config", "expected"), CASES, ids=[c[0] for c in CASES])
def test_malformed_config_error_names_the_key(label: str, config: Any, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config, source="cfg.json")
    message = str(info.value)
    assert expected in message, message
    assert message.startswith("cfg.json"), message
    assert "\n" not in message


def test_invalid_json_file_names_file_and_position(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",\n "hidden_size": 64,,}')
    with pytest.raises(ConfigError, match=r"config\.json: invalid JSON at line 2 column 20: Expecting property name"):
        load_model(path)


@pytest.mark.parametrize("content", [b"\xff\xfe\x00", b"[1, 2]", b""])
def test_non_object_or_binary_config_files(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_model(path)
    assert str(info.value).startswith(str(path))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)


def _check(config: Any) -> None:
    try:
        spec = parse_config(config, source="fuzz")
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc)
    else:
        assert spec.num_parameters >= 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_random_json_never_raises_anything_but_config_errors(value: Any) -> None:
    _check(value)


KEYS = sorted({key for config in FAMILY_CONFIGS.values() for key in config})


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.sampled_from(sorted(FAMILY_CONFIGS)),
    edits=st.dictionaries(
        st.sampled_from([*KEYS, "layer_types", "rope_scaling", "quantization_config", "head_dim", "text_config"]),
        json_values,
        max_size=4,
    ),
    drops=st.sets(st.sampled_from(KEYS), max_size=3),
)
def test_mutated_real_configs_never_raise_anything_but_config_errors(
    base: str, edits: dict[str, Any], drops: set[str]
) -> None:
    config = {k: v for k, v in FAMILY_CONFIGS[base].items() if k not in drops}
    config.update(edits)
    _check(json.loads(json.dumps(config, allow_nan=True)))
