"""Qwen3-Next: gated DeltaNet linear attention and gated full attention, MoE with a gated shared expert.

``layer_types`` lists ``linear_attention`` / ``full_attention`` per layer (absent: every
``full_attention_interval``-th layer, default 4, is full attention). Full attention has per-head
q/k RMSNorms and an output gate (``q_proj`` yields queries and gates, ``o_proj(attn *
sigmoid(gate))``). MoE layers as in Qwen2-MoE (``mlp_only_layers``, ``decoder_sparse_step``;
no experts at all: every layer dense). Norms are ``(1 + weight)`` RMSNorms computed in fp32.
Defaults are ``Qwen3NextConfig``'s, each one used recorded in the assumptions.
Source: transformers 5.x configuration_qwen3_next.py, modeling_qwen3_next.py.
"""

from __future__ import annotations

from vramlens.errors import ConfigError
from vramlens.model.config_reader import MAX_LAYERS, ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import build_spec, moe_spec, read_position
from vramlens.model.families._hybrid import ClassDefaults, block_types, kv_heads, layers_from_types
from vramlens.model.spec import AttentionSpec, FfnKind, MixerKind, MlpKind, MlpSpec, ModelSpec, QKNorm
from vramlens.model.ssm import LinearAttentionSpec

_MIXERS = {"linear_attention": MixerKind.LINEAR_ATTENTION, "full_attention": MixerKind.ATTENTION}


def _layer_types(view: ConfigView, d: ClassDefaults, layers: int) -> tuple[str, ...]:
    if view.present("layer_types"):
        return block_types(view, "layer_types", layers=layers, allowed=_MIXERS)
    interval = d.integer("full_attention_interval", default=4, maximum=MAX_LAYERS)
    return tuple("linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers))


def _ffn_kinds(view: ConfigView, d: ClassDefaults, layers: int, experts: int) -> dict[int, FfnKind]:
    only_dense = set(view.integers("mlp_only_layers") or ())
    step = d.integer("decoder_sparse_step", default=1, maximum=MAX_LAYERS)
    return {
        i: FfnKind.MOE if (i not in only_dense and experts > 0 and (i + 1) % step == 0) else FfnKind.DENSE
        for i in range(layers)
    }


@register("qwen3_next")
def parse_qwen3_next(view: ConfigView) -> ModelSpec:
    """Qwen3-Next-80B-A3B and its configs."""
    d = ClassDefaults(view, "Qwen3NextConfig")
    hidden = d.integer("hidden_size", default=2048)
    layers = d.integer("num_hidden_layers", default=48, maximum=MAX_LAYERS)
    heads = d.integer("num_attention_heads", default=16)
    bias = d.flag("attention_bias", False)
    attention = AttentionSpec(
        num_heads=heads,
        num_kv_heads=kv_heads(view, d, heads, default=2),
        head_dim=d.integer("head_dim", default=256),
        qkv_bias=bias,
        out_bias=bias,
        qk_norm=QKNorm.PER_HEAD,
        output_gate=True,
        dropout=d.number("attention_dropout", 0.0),
    )
    act = d.text("hidden_act", default="silu")
    try:
        linear = LinearAttentionSpec(
            num_key_heads=d.integer("linear_num_key_heads", default=16),
            num_value_heads=d.integer("linear_num_value_heads", default=32),
            key_head_dim=d.integer("linear_key_head_dim", default=128),
            value_head_dim=d.integer("linear_value_head_dim", default=128),
            conv_kernel=d.integer("linear_conv_kernel_dim", default=4),
            activation=act,
        )
    except ConfigError as exc:
        raise ConfigError(f"{view.source}: {exc}") from None
    experts = d.integer("num_experts", default=512, minimum=0)
    ffn = _ffn_kinds(view, d, layers, experts)
    moe = None
    if FfnKind.MOE in ffn.values():
        moe = moe_spec(
            view,
            num_experts=experts,
            experts_per_token=d.integer("num_experts_per_tok", default=10),
            expert_intermediate_size=d.integer("moe_intermediate_size", default=512),
            shared_intermediate_size=d.integer("shared_expert_intermediate_size", default=512),
            num_shared_experts=1,
            shared_expert_gate=True,
            activation=act,
        )
    needs_dense = FfnKind.DENSE in ffn.values()
    mlp = MlpSpec(kind=MlpKind.GATED, intermediate_size=d.integer("intermediate_size", default=5632), activation=act)
    position = read_position(view, max_default=32768, rotary_default=0.25)
    return build_spec(
        view,
        "qwen3_next",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=d.integer("vocab_size", default=151936),
        attention=attention,
        mlp=mlp if needs_dense else None,
        moe=moe,
        linear_attention=linear,
        layers=layers_from_types(_layer_types(view, d, layers), _MIXERS, ffn),
        position=position,
        tie_word_embeddings=d.flag("tie_word_embeddings", False),
    )
