"""Structure of the multimodal and nested-config families read from their configs, by hand."""

from __future__ import annotations

from family_configs import FAMILY_CONFIGS
from vramlens.model.families import parse_config
from vramlens.model.spec import QKNorm


def test_llama4_layers_interleave_moe_chunked_and_nope() -> None:
    spec = parse_config(FAMILY_CONFIGS["llama4_text"])
    # interleave_moe_layer_step 2: layers 1 and 3 are MoE; no_rope_layer_interval 4: layer 3 is NoPE and full.
    assert [layer.moe for layer in spec.layers] == [False, True, False, True]
    assert [layer.rope for layer in spec.layers] == [True, True, True, False]
    assert [layer.chunk for layer in spec.layers] == [16, 16, 16, None]
    assert spec.attention.qk_norm is QKNorm.L2
    assert spec.moe is not None and spec.moe.shared_intermediate_size == 32 and not spec.moe.shared_expert_gate
    assert spec.mlp is not None and spec.mlp.intermediate_size == 96
    # One of four experts active per token, plus the shared expert: 3 idle experts of 3*64*32 in 2 layers.
    assert spec.num_parameters - spec.active_parameters == 2 * 3 * 3 * 64 * 32


def test_llama4_explicit_lists_win() -> None:
    config = {**FAMILY_CONFIGS["llama4_text"], "moe_layers": [0], "no_rope_layers": [0, 1, 1, 1, 1]}
    spec = parse_config(config)
    assert [layer.moe for layer in spec.layers] == [True, False, False, False]
    assert [layer.rope for layer in spec.layers] == [False, True, True, True]
    assert [layer.chunk for layer in spec.layers] == [None, 16, 16, 16]
    base = parse_config(FAMILY_CONFIGS["llama4_text"])
    without_qk = parse_config({**FAMILY_CONFIGS["llama4_text"], "use_qk_norm": False})
    assert without_qk.attention.qk_norm is QKNorm.NONE
    assert without_qk.num_parameters == base.num_parameters  # the L2 norms have no weights


def test_llama4_wrapper_is_text_plus_vision() -> None:
    spec = parse_config(FAMILY_CONFIGS["llama4"])
    text = parse_config({**FAMILY_CONFIGS["llama4_text"]})
    assert spec.vision is not None and spec.vision.kind == "llama4"
    assert spec.num_parameters == text.num_parameters + spec.vision.parameters
    assert spec.parameter_breakdown.projector == 64 * 64  # linear_1: vision_output_dim -> text hidden, no bias
    assert spec.model_type == "llama4" and spec.layers == text.layers


def test_qwen2_5_vl_flat_and_nested_layouts_agree() -> None:
    flat = parse_config(FAMILY_CONFIGS["qwen2_5_vl-flat-tied-sliding"])
    assert flat.tie_word_embeddings
    assert [layer.window for layer in flat.layers] == [None, 16, 16]
    nested = parse_config(FAMILY_CONFIGS["qwen2_5_vl"])
    assert not nested.tie_word_embeddings and all(layer.window is None for layer in nested.layers)
    # The head size is hidden / heads whatever the config says (Qwen2_5_VLAttention).
    assert parse_config({**FAMILY_CONFIGS["qwen2_5_vl-flat-tied-sliding"], "head_dim": 48}).head_dim == 16
    text_tied = {**FAMILY_CONFIGS["qwen2_5_vl"]}
    text_tied["text_config"] = {**text_tied["text_config"], "tie_word_embeddings": True}
    assert parse_config(text_tied).tie_word_embeddings  # Qwen2_5_VLConfig forwards the text part's flag


def test_qwen3_vl_moe_places_experts_and_records_defaults() -> None:
    spec = parse_config(FAMILY_CONFIGS["qwen3_vl_moe"])
    assert [layer.moe for layer in spec.layers] == [False, True, False, True]
    assert spec.head_dim == 16  # Qwen3VLMoeTextConfig: hidden / heads when absent
    assert spec.vision is not None
    assert any(a.startswith("'spatial_merge_size' not in config") for a in spec.assumptions)
    dense = parse_config(FAMILY_CONFIGS["qwen3_vl"])
    assert dense.head_dim == 32 and dense.tie_word_embeddings


def test_mistral3_ties_by_default_and_reads_its_text_type() -> None:
    spec = parse_config(FAMILY_CONFIGS["mistral3"])
    assert spec.tie_word_embeddings  # Mistral3Config's default
    assert any("Mistral3Config default" in a for a in spec.assumptions)
    ministral = parse_config(FAMILY_CONFIGS["mistral3-ministral3"])
    assert not ministral.tie_word_embeddings and ministral.head_dim == 16
    assert parse_config(FAMILY_CONFIGS["ministral3"]).head_dim == 128  # Ministral3Config default, not hidden / heads
