"""OLMoE (AllenAI OLMoE-1B-7B): every layer a mixture of experts, RMSNorm over the whole q and k projections.

As transformers' ``OlmoeConfig`` / ``modeling_olmoe.py`` (5.x) build it: pre-norm RMSNorm blocks,
rotary positions, attention with ``q_norm`` over ``hidden_size`` and ``k_norm`` over the key
projection (``kv_heads x head_dim``), optional ``clip_qkv`` (in place, no memory), and in every
layer ``num_experts`` (64) bias-free SwiGLU experts of width ``intermediate_size`` behind a
softmax top-``num_experts_per_tok`` (8) router without re-normalization (``norm_topk_prob``
false). ``head_dim`` is ``hidden_size // num_attention_heads``. Absent keys take
``OlmoeConfig``'s defaults, each recorded in the assumptions.
"""

from __future__ import annotations

from vramlens.model.config_reader import ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import build_spec, moe_spec, read_position
from vramlens.model.families._defaults import kv_heads, read_layer_count
from vramlens.model.spec import AttentionSpec, FfnKind, LayerSpec, ModelSpec, QKNorm

_WHY = "OlmoeConfig default"


def _attention(view: ConfigView, hidden: int) -> AttentionSpec:
    heads = view.integer("num_attention_heads", default=16, why=_WHY)
    if hidden % heads:
        # OlmoeAttention normalizes the queries over hidden_size: the q projection must be that wide.
        raise view.error("num_attention_heads", f"must divide hidden_size {hidden} (OLMoE's q_norm spans hidden_size)")
    head_dim = hidden // heads
    if view.present("head_dim") is not None and view.integer("head_dim") != head_dim:
        raise view.error("head_dim", f"must be hidden_size / num_attention_heads = {head_dim} (OLMoE's q_norm)")
    bias = view.flag("attention_bias", default=False, why=_WHY)
    return AttentionSpec(
        num_heads=heads,
        num_kv_heads=kv_heads(view, heads, default=None, why=_WHY),
        head_dim=head_dim,
        qkv_bias=bias,
        out_bias=bias,
        qk_norm=QKNorm.PER_PROJECTION,
        clip_qkv=view.opt_number("clip_qkv", minimum=0.0) is not None,
        dropout=view.number("attention_dropout", default=0.0, minimum=0.0, maximum=0.999),
    )


@register("olmoe")
def parse_olmoe(view: ConfigView) -> ModelSpec:
    """OLMoE: all-MoE layers, per-projection q/k RMSNorm, no shared expert."""
    hidden = view.integer("hidden_size", default=2048, why=_WHY)
    layers = read_layer_count(view, default=16, why=_WHY)
    moe = moe_spec(
        view,
        num_experts=view.integer("num_experts", "num_local_experts", default=64, why=_WHY),
        experts_per_token=view.integer("num_experts_per_tok", default=8, why=_WHY),
        expert_intermediate_size=view.integer("intermediate_size", default=2048, why=_WHY),
        activation=view.text("hidden_act", default="silu"),
    )
    return build_spec(
        view,
        "olmoe",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=view.integer("vocab_size", default=50304, why=_WHY),
        attention=_attention(view, hidden),
        mlp=None,
        moe=moe,
        layers=tuple(LayerSpec(ffn=FfnKind.MOE) for _ in range(layers)),
        position=read_position(view, max_default=4096),
        tie_word_embeddings=view.flag("tie_word_embeddings", default=False, why=_WHY),
    )
