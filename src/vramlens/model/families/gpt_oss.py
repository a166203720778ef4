"""gpt-oss (OpenAI gpt-oss-20b, gpt-oss-120b): every layer a biased MoE, attention sinks, alternating windows.

As transformers' ``GptOssConfig`` / ``modeling_gpt_oss.py`` (5.x) build it:

* attention: GQA with biases on q, k, v and o (``attention_bias``, default true) and one learned
  sink logit per head (``sinks``) that joins every softmax; ``layer_types`` alternates a
  ``sliding_window`` (128) layer and a full layer, starting with a sliding one;
* every layer is a mixture of experts: a biased router ``h -> E`` (top-k on the logits, softmax
  over the k chosen), and ``E`` experts whose ``gate_up_proj`` ``[E, h, 2i]`` (gate and up
  interleaved) and ``down_proj`` ``[E, i, h]`` carry biases; the experts apply a clamped SwiGLU
  (``gate.clamp(max=limit) * sigmoid(alpha * gate) * (up.clamp(-limit, limit) + 1)``, alpha 1.702,
  limit 7.0), not ``hidden_act``;
* RMSNorm before attention and before the experts; untied head.

Checkpoints store the experts as MXFP4 (``quantization_config.quant_method: mxfp4``): transformers
converts only the experts (``Mxfp4GptOssExperts``), and dequantizes them to bf16 when its
kernels are missing or when asked (``dequantize: true``); it cannot train MXFP4 weights. Absent
keys take ``GptOssConfig``'s defaults (the 120B shape), each recorded in the assumptions.
"""

from __future__ import annotations

import dataclasses

from vramlens.model.config_reader import ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import build_spec, moe_spec, read_position
from vramlens.model.families._defaults import kv_heads, layer_type_list, nullable_integer, read_layer_count
from vramlens.model.quantization import QuantMethod
from vramlens.model.spec import AttentionSpec, FfnKind, LayerSpec, ModelSpec

_WHY = "GptOssConfig default"
#: Name of the experts' gate (estimate/moe_parts.py counts what it keeps for backward).
CLAMPED_SWIGLU = "clamped_swiglu"


def _head_dim(view: ConfigView, hidden: int, heads: int) -> int:
    """``head_dim``: its value; ``null`` -> ``hidden // heads`` (``__post_init__``); absent -> 64."""
    if view.present("head_dim") is not None:
        return view.integer("head_dim")
    if "head_dim" in view.data:
        if hidden < heads:
            raise view.error("head_dim", f"is null and hidden_size {hidden} < num_attention_heads {heads}")
        return hidden // heads
    return view.integer("head_dim", default=64, why=_WHY)


def _windows(view: ConfigView, layers: int) -> tuple[int | None, ...]:
    """``layer_types`` (default: sliding on even indices, full on odd) with ``sliding_window`` (default 128)."""
    window = nullable_integer(view, "sliding_window", default=128, why=_WHY)
    types = layer_type_list(view, layers, ("sliding_attention", "full_attention"))
    if types is None:
        types = tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers))
    if window is None and "sliding_attention" in types:
        raise view.error("sliding_window", "must be a positive integer when layers use sliding_attention")
    return tuple(window if kind == "sliding_attention" else None for kind in types)


@register("gpt_oss")
def parse_gpt_oss(view: ConfigView) -> ModelSpec:
    """gpt-oss: sinks, alternating sliding/full attention, biased router and experts (MXFP4 in checkpoints)."""
    hidden = view.integer("hidden_size", default=2880, why=_WHY)
    layers = read_layer_count(view, default=36, why=_WHY)
    heads = view.integer("num_attention_heads", default=64, why=_WHY)
    bias = view.flag("attention_bias", default=True, why=_WHY)
    attention = AttentionSpec(
        num_heads=heads,
        num_kv_heads=kv_heads(view, heads, default=8, why=_WHY),
        head_dim=_head_dim(view, hidden, heads),
        qkv_bias=bias,
        out_bias=bias,
        sinks=True,
        dropout=view.number("attention_dropout", default=0.0, minimum=0.0, maximum=0.999),
    )
    moe = moe_spec(
        view,
        num_experts=view.integer("num_local_experts", "num_experts", default=128, why=_WHY),
        experts_per_token=view.integer("num_experts_per_tok", default=4, why=_WHY),
        expert_intermediate_size=view.integer("intermediate_size", default=2880, why=_WHY),
        activation=CLAMPED_SWIGLU,
        expert_bias=True,
        router_bias=True,
    )
    windows = _windows(view, layers)
    spec = build_spec(
        view,
        "gpt_oss",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=view.integer("vocab_size", default=201088, why=_WHY),
        attention=attention,
        mlp=None,
        moe=moe,
        layers=tuple(LayerSpec(window=w, ffn=FfnKind.MOE) for w in windows),
        position=read_position(view, max_default=131072),
        tie_word_embeddings=view.flag("tie_word_embeddings", default=False, why=_WHY),
    )
    return _with_mxfp4(view, spec)


def _with_mxfp4(view: ConfigView, spec: ModelSpec) -> ModelSpec:
    """The experts' MXFP4 storage, as transformers loads it: ``dequantize: true`` means bf16 weights."""
    quant = spec.quantization
    if quant is None or quant.method is not QuantMethod.MXFP4:
        return spec
    raw = view.data.get("quantization_config")
    dequantize = raw.get("dequantize", False) if isinstance(raw, dict) else False
    if not isinstance(dequantize, bool):
        raise view.error("quantization_config.dequantize", f"must be true or false, got {dequantize!r}")
    if dequantize:
        notes = (*spec.assumptions, "quantization_config mxfp4 with dequantize: true: the experts load as bf16")
        return dataclasses.replace(spec, quantization=None, assumptions=notes)
    note = (
        "MXFP4 experts (4-bit elements, one E8M0 scale per 32) for inference; transformers cannot train MXFP4 "
        "weights, so training counts them dequantized (Mxfp4Config(dequantize=True), OpenAI's fine-tuning recipe)"
    )
    return dataclasses.replace(spec, assumptions=(*spec.assumptions, note))
