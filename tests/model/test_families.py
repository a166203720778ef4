"""model/families: each parser reads its family's keys into the right ModelSpec.

Counts here are checked by hand for a few families; every family is also built
by transformers in test_hf_parity.py.
"""

from __future__ import annotations

import pytest

from family_configs import FAMILY_CONFIGS, LEGACY_FALCON, native_falcon
from vramlens.errors import ConfigError
from vramlens.model.families import parse_config, supported_model_types
from vramlens.model.spec import MlpKind, NormKind, PositionKind, QKNorm

REQUIRED_TYPES = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
    "phi", "phi3", "gpt2", "gpt_neox", "falcon", "olmo2", "starcoder2", "deepseek_v2", "deepseek_v3",
}  # fmt: skip


def test_every_required_model_type_has_a_parser_and_a_test_config() -> None:
    assert set(supported_model_types()) >= REQUIRED_TYPES
    tested = {config["model_type"] for config in FAMILY_CONFIGS.values()}
    assert tested >= REQUIRED_TYPES


def test_the_lazy_family_table_names_exactly_what_the_modules_register() -> None:
    """``_FAMILY_MODULES`` (model_type -> module, imported on first use) must match the
    ``@register`` calls: a type in the table whose module does not register it, or a registered
    type missing from the table, fails here."""
    import importlib
    import pkgutil

    from vramlens.model import families

    for module in pkgutil.iter_modules(families.__path__):
        importlib.import_module(f"{families.__name__}.{module.name}")
    registered = {model_type: parser.__module__.rsplit(".", 1)[-1] for model_type, parser in families._PARSERS.items()}
    assert registered == families._FAMILY_MODULES


@pytest.mark.parametrize("key", sorted(FAMILY_CONFIGS))
def test_family_configs_parse(key: str) -> None:
    spec = parse_config(FAMILY_CONFIGS[key], source=key)
    assert spec.num_parameters > 0
    assert len(spec.layers) == spec.num_layers


def test_tiny_llama_by_hand() -> None:
    spec = parse_config(FAMILY_CONFIGS["llama"])
    h, i, V = 64, 160, 128
    attention = h * 4 * 16 + 2 * h * 2 * 16 + 4 * 16 * h
    per_layer = attention + 3 * h * i + 2 * h
    assert spec.num_parameters == V * h + 3 * per_layer + h + V * h
    assert spec.attention.kind == "GQA" and spec.head_dim == 16


def test_llama_biases_and_tied_head() -> None:
    spec = parse_config(FAMILY_CONFIGS["llama-biases"])
    plain = parse_config(FAMILY_CONFIGS["llama"])
    q_kv_o_biases = 4 * 16 + 2 * 2 * 16 + 64
    mlp_biases = 2 * 160 + 64
    assert spec.num_parameters == plain.num_parameters - 128 * 64 + 3 * (q_kv_o_biases + mlp_biases)


def test_mistral_explicit_head_dim_and_window() -> None:
    spec = parse_config(FAMILY_CONFIGS["mistral-window-headdim"])
    assert spec.head_dim == 24  # not hidden/heads = 16 (Mistral-Nemo style)
    assert all(layer.window == 32 for layer in spec.layers)


def test_qwen2_sliding_window_rule() -> None:
    spec = parse_config(FAMILY_CONFIGS["qwen2-sliding"])
    assert [layer.window for layer in spec.layers] == [None, 16, 16]
    assert spec.attention.qkv_bias and not spec.attention.out_bias


def test_qwen2_moe_layer_placement_and_shared_expert() -> None:
    spec = parse_config(FAMILY_CONFIGS["qwen2_moe"])
    assert [layer.moe for layer in spec.layers] == [False, True, False, True]
    assert spec.moe is not None and spec.moe.shared_expert_gate and spec.moe.shared_intermediate_size == 48
    breakdown = spec.parameter_breakdown
    assert breakdown.moe_experts == 2 * 4 * 3 * 64 * 32
    assert breakdown.moe_shared == 2 * (3 * 64 * 48 + 64)
    assert breakdown.moe_router == 2 * 4 * 64
    assert breakdown.mlp == 2 * 3 * 64 * 160


def test_qwen3_head_dim_default_is_recorded() -> None:
    config = {k: v for k, v in FAMILY_CONFIGS["qwen3"].items() if k != "head_dim"}
    spec = parse_config(config)
    assert spec.head_dim == 128
    assert any("head_dim" in a and "Qwen3Config" in a for a in spec.assumptions)


def test_gemma_windows() -> None:
    gemma2 = parse_config(FAMILY_CONFIGS["gemma2"])
    assert [layer.window for layer in gemma2.layers] == [16, None, 16, None]
    assert gemma2.norms_per_layer == 4 and gemma2.final_logit_softcap == 30.0
    gemma3 = parse_config(FAMILY_CONFIGS["gemma3_text"])
    assert [layer.window for layer in gemma3.layers] == [16, 16, 16, 16, 16, None]
    assert gemma3.attention.qk_norm is QKNorm.PER_HEAD
    explicit = parse_config(
        {**FAMILY_CONFIGS["gemma3_text"], "layer_types": ["full_attention"] * 3 + ["sliding_attention"] * 3}
    )
    assert [layer.window for layer in explicit.layers] == [None, None, None, 16, 16, 16]


def test_gemma3_multimodal_counts_vision_tower() -> None:
    spec = parse_config(FAMILY_CONFIGS["gemma3"])
    assert spec.vision is not None
    # SigLIP: conv 3*14*14*32+32, positions (28/14)^2*32, 2 layers x (2 LN + 4 biased projections + MLP), post LN.
    layer = 2 * 64 + 4 * (32 * 32 + 32) + (32 * 64 + 64) + (64 * 32 + 32)
    assert spec.vision.tower_parameters == 3 * 14 * 14 * 32 + 32 + 4 * 32 + 2 * layer + 64
    assert spec.vision.projector_parameters == 32 * 64 + 32
    text_only = parse_config({**FAMILY_CONFIGS["gemma3"]["text_config"], "torch_dtype": "bfloat16"})
    assert spec.num_parameters == text_only.num_parameters + spec.vision.parameters
    assert spec.num_heads == 8 and spec.num_kv_heads == 4  # Gemma3TextConfig defaults, recorded:
    assert any("num_attention_heads" in a for a in spec.assumptions)


def test_phi2_layout() -> None:
    spec = parse_config(FAMILY_CONFIGS["phi"])
    assert spec.norm.kind is NormKind.LAYERNORM and spec.norm.bias and spec.norms_per_layer == 1
    assert spec.lm_head_bias and spec.parallel_residual
    assert spec.position.rotary_fraction == 0.5
    with_qk = parse_config(FAMILY_CONFIGS["phi-qk-layernorm"])
    assert with_qk.num_parameters - spec.num_parameters == 3 * 2 * 2 * 16  # q and k LayerNorm(16) with bias


def test_gpt2_by_hand() -> None:
    spec = parse_config(FAMILY_CONFIGS["gpt2"])
    per_layer = 4 * 64 + (64 * 192 + 192) + (64 * 64 + 64) + (64 * 256 + 256) + (256 * 64 + 64)
    assert spec.num_parameters == 100 * 64 + 128 * 64 + 2 * per_layer + 128
    assert spec.position.kind is PositionKind.LEARNED and spec.tie_word_embeddings
    assert spec.hidden_dropout == 0.1  # GPT2Config default resid_pdrop


def test_falcon_variants() -> None:
    new = parse_config(FAMILY_CONFIGS["falcon-new"])
    assert (new.num_kv_heads, new.norms_per_layer) == (2, 2)
    mqa = parse_config(FAMILY_CONFIGS["falcon-mqa"])
    assert (mqa.num_kv_heads, mqa.norms_per_layer) == (1, 1)
    sequential = parse_config(FAMILY_CONFIGS["falcon-sequential"])
    assert (sequential.num_kv_heads, sequential.norms_per_layer, sequential.parallel_residual) == (8, 2, False)
    assert (
        sequential.mlp is not None and sequential.mlp.intermediate_size == 96 and sequential.mlp.kind is MlpKind.PLAIN
    )


def test_legacy_refinedweb_equals_native_falcon() -> None:
    legacy = parse_config(LEGACY_FALCON)
    native = parse_config(native_falcon(LEGACY_FALCON))
    assert legacy.num_parameters == native.num_parameters
    assert (legacy.num_kv_heads, legacy.norms_per_layer) == (2, 2)


def test_deepseek_layouts() -> None:
    v2 = parse_config(FAMILY_CONFIGS["deepseek_v2"])
    assert [layer.moe for layer in v2.layers] == [False, True, True]
    assert v2.attention.mla is not None and v2.attention.mla.q_lora_rank is None
    assert v2.moe is not None and v2.moe.shared_intermediate_size == 48
    v3 = parse_config({**FAMILY_CONFIGS["deepseek_v3"], "num_nextn_predict_layers": 1})
    assert v3.moe is not None and v3.moe.router_score_bias
    assert any("multi-token-prediction" in a for a in v3.assumptions)


def test_unknown_model_type_with_llama_keys_is_refused_never_read_as_llama() -> None:
    with pytest.raises(ConfigError, match=r"^cfg: model_type 'my_custom_llama' ") as info:
        parse_config({**FAMILY_CONFIGS["llama"], "model_type": "my_custom_llama"}, source="cfg")
    assert "\n" not in str(info.value) and "llama-style" not in str(info.value).lower()


def test_remote_code_alias_is_read_as_the_family_whose_code_it_ships() -> None:
    kimi = parse_config({**FAMILY_CONFIGS["deepseek_v3"], "model_type": "kimi_k2", "auto_map": {"AutoConfig": "x.Y"}})
    native = parse_config(FAMILY_CONFIGS["deepseek_v3"])
    assert kimi.model_type == "deepseek_v3" and kimi.num_parameters == native.num_parameters
    assert any("'kimi_k2' is read as deepseek_v3" in a and "modeling_deepseek" in a for a in kimi.assumptions)
    assert kimi.config is not None and kimi.config["model_type"] == "deepseek_v3" and "auto_map" not in kimi.config
