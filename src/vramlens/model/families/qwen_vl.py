"""Qwen vision-language models: Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE.

Each is a vision tower with its merger (:mod:`vramlens.model.families.towers`) in front of
a Qwen text decoder with multimodal rotary positions (mrope: the rotary angle of each
frequency band follows the temporal, height or width position; for text tokens all three
are the token position, so memory is that of 1-D rotary). The decoders:

* Qwen2.5-VL (``Qwen2_5_VLTextModel``): Qwen2 layers - q/k/v biases, no o bias; the head
  size is always ``hidden_size / num_attention_heads`` (a ``head_dim`` key is not read);
  Qwen's sliding-window rule with ``max_window_layers`` defaulting to 80. Configs may be
  flat (text keys at the top level), as ``Qwen2_5_VLConfig`` accepts.
* Qwen3-VL (``Qwen3VLTextModel``): Qwen3 layers - per-head q/k RMSNorm, ``head_dim``
  default 128, no sliding windows.
* Qwen3-VL-MoE (``Qwen3VLMoeTextModel``): Qwen3-MoE layers (softmax top-k router,
  re-normalized, no shared expert), ``head_dim`` default ``hidden / heads``,
  ``mlp_only_layers`` and ``decoder_sparse_step``.

DeepStack (Qwen3-VL) adds vision features to the first decoder layers' hidden states only
when images are present. Tying: the top-level ``tie_word_embeddings`` (Qwen2.5-VL also
honours ``text_config.tie_word_embeddings``, as its config class forwards it).
"""

from __future__ import annotations

import dataclasses

from vramlens.model.config_reader import MAX_LAYERS, ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import (
    build_spec,
    dense_gated_mlp,
    explicit_windows,
    layer_specs,
    moe_every,
    moe_spec,
    read_layers,
    read_position,
    standard_attention,
)
from vramlens.model.families._nested import nested_parts, wrap_text_spec
from vramlens.model.families.towers import qwen2_5_vl_vision, qwen3_vl_vision
from vramlens.model.spec import ModelSpec, MoeSpec, QKNorm

_TEXT = {
    "qwen2_5_vl": "transformers' Qwen2_5_VLTextConfig default",
    "qwen3_vl": "transformers' Qwen3VLTextConfig default",
    "qwen3_vl_moe": "transformers' Qwen3VLMoeTextConfig default",
}
_TIE = "transformers' {} default"


def _qwen2_5_vl_windows(view: ConfigView, layers: int, why: str) -> tuple[int | None, ...]:
    """Qwen's rule (``layer_types``, else with ``use_sliding_window`` the layers from
    ``max_window_layers`` on), with Qwen2_5_VLTextConfig's defaults (window 4096, from layer 80)."""
    use = view.flag("use_sliding_window", default=False)
    window = view.integer("sliding_window", default=4096, why=why) if use else None
    explicit = explicit_windows(view, layers, window)
    if explicit is not None:
        return explicit
    first = view.integer("max_window_layers", default=80, minimum=0, maximum=MAX_LAYERS, why=why if use else None)
    return tuple(window if window is not None and i >= first else None for i in range(layers))


def _qwen2_5_vl_text(view: ConfigView) -> ModelSpec:
    why = _TEXT["qwen2_5_vl"]
    hidden = view.integer("hidden_size")
    attention = standard_attention(view, hidden, qkv_bias=True, out_bias=False)
    heads = attention.num_heads
    if hidden % heads:
        raise view.error("hidden_size", f"must be divisible by num_attention_heads ({heads}), got {hidden}")
    attention = dataclasses.replace(attention, head_dim=hidden // heads)
    layers = read_layers(view, "num_hidden_layers")
    return build_spec(
        view,
        "qwen2_5_vl",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=view.integer("vocab_size"),
        attention=attention,
        mlp=dense_gated_mlp(view),
        layers=layer_specs(_qwen2_5_vl_windows(view, layers, why)),
        position=read_position(view, max_default=32768),
    )


def _qwen3_vl_text(view: ConfigView, model_type: str) -> ModelSpec:
    why = _TEXT[model_type]
    hidden = view.integer("hidden_size")
    bias = view.flag("attention_bias", default=False, why=why)
    heads = view.integer("num_attention_heads")
    head_default = 128 if model_type == "qwen3_vl" else (hidden // heads if hidden % heads == 0 else None)
    attention = standard_attention(
        view,
        hidden,
        qkv_bias=bias,
        out_bias=bias,
        qk_norm=QKNorm.PER_HEAD,
        head_dim_default=None if view.present("head_dim") else head_default,
        head_dim_why=why,
    )
    layers = read_layers(view, "num_hidden_layers")
    moe: MoeSpec | None = None
    rule = None
    if model_type == "qwen3_vl_moe":
        moe = moe_spec(
            view,
            num_experts=view.integer("num_experts", "num_local_experts", default=60, why=why),
            experts_per_token=view.integer("num_experts_per_tok", default=4, why=why),
            expert_intermediate_size=view.integer("moe_intermediate_size", default=1408, why=why),
            activation=view.text("hidden_act", default="silu", why=why),
        )
        rule = moe_every(view, layers)
    dense = rule is None or any(not rule(i) for i in range(layers))
    return build_spec(
        view,
        model_type,
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=view.integer("vocab_size"),
        attention=attention,
        mlp=dense_gated_mlp(view) if dense else None,
        moe=moe,
        layers=layer_specs((None,) * layers, rule),
        position=read_position(view, max_default=128000),
    )


@register("qwen2_5_vl")
def parse_qwen2_5_vl(view: ConfigView) -> ModelSpec:
    """Qwen2.5-VL (3B, 7B, 32B, 72B): Qwen2.5-VL vision tower and merger, Qwen2 text decoder."""
    text, vision_view = nested_parts(view, "qwen2_5_vl", flat_text=True)
    spec = _qwen2_5_vl_text(text)
    tie = view.flag("tie_word_embeddings", default=False, why=_TIE.format("Qwen2_5_VLConfig"))
    if text is not view and not tie:
        tie = text.flag("tie_word_embeddings", default=False)
    return wrap_text_spec(view, "qwen2_5_vl", spec, qwen2_5_vl_vision(vision_view), tie_word_embeddings=tie)


def _qwen3_vl(view: ConfigView, model_type: str, config_class: str) -> ModelSpec:
    text, vision_view = nested_parts(view, model_type)
    spec = _qwen3_vl_text(text, model_type)
    tie = view.flag("tie_word_embeddings", default=False, why=_TIE.format(config_class))
    return wrap_text_spec(view, model_type, spec, qwen3_vl_vision(vision_view), tie_word_embeddings=tie)


@register("qwen3_vl")
def parse_qwen3_vl(view: ConfigView) -> ModelSpec:
    """Qwen3-VL dense (2B to 32B): Qwen3-VL vision tower with DeepStack mergers, Qwen3 text decoder."""
    return _qwen3_vl(view, "qwen3_vl", "Qwen3VLConfig")


@register("qwen3_vl_moe")
def parse_qwen3_vl_moe(view: ConfigView) -> ModelSpec:
    """Qwen3-VL-MoE (30B-A3B, 235B-A22B): Qwen3-VL vision tower, Qwen3-MoE text decoder."""
    return _qwen3_vl(view, "qwen3_vl_moe", "Qwen3VLMoeConfig")
