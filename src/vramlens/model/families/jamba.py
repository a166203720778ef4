"""Jamba (AI21): Mamba 1 layers with attention every ``attn_layer_period`` layers and MoE every
``expert_layer_period`` layers; no positional encoding.

Layer ``i`` is attention when ``i % attn_layer_period == attn_layer_offset``, else Mamba; its
FFN is an MoE of ``num_experts`` experts of width ``intermediate_size`` when
``i % expert_layer_period == expert_layer_offset`` (and more than one expert), else a dense
SwiGLU of the same width. The Mamba mixer (``JambaMambaMixer``) has RMSNorms on dt, B and C.
Defaults are ``JambaConfig``'s, each one used recorded in the assumptions.
Source: transformers 5.x configuration_jamba.py, modeling_jamba.py.
"""

from __future__ import annotations

import math

from vramlens.errors import ConfigError
from vramlens.model.config_reader import MAX_LAYERS, ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import build_spec, moe_spec, read_head_dim
from vramlens.model.families._hybrid import ClassDefaults, kv_heads
from vramlens.model.spec import (
    AttentionSpec,
    FfnKind,
    LayerSpec,
    MixerKind,
    MlpKind,
    MlpSpec,
    ModelSpec,
    PositionKind,
    PositionSpec,
)
from vramlens.model.ssm import MambaSpec, MambaVersion


def _period(view: ConfigView, d: ClassDefaults, what: str, period: int, offset: int) -> tuple[int, int]:
    p = d.integer(f"{what}_layer_period", default=period, maximum=MAX_LAYERS)
    o = d.integer(f"{what}_layer_offset", default=offset, minimum=0, maximum=MAX_LAYERS)
    if o >= p:
        raise view.error(f"{what}_layer_offset", f"({o}) must be smaller than {what}_layer_period ({p})")
    return p, o


def _dt_rank(view: ConfigView, hidden: int) -> int:
    raw = view.data.get("mamba_dt_rank", "auto")
    if raw == "auto":
        if "mamba_dt_rank" not in view.data:
            view.assumptions.append("'mamba_dt_rank' not in config; using auto = ceil(hidden_size / 16) (JambaConfig)")
        return math.ceil(hidden / 16)
    return view.integer("mamba_dt_rank")


def _mamba(view: ConfigView, d: ClassDefaults, hidden: int, act: str) -> MambaSpec:
    try:
        return MambaSpec(
            version=MambaVersion.MAMBA1,
            intermediate_size=d.integer("mamba_expand", default=2) * hidden,
            state_size=d.integer("mamba_d_state", default=16),
            conv_kernel=d.integer("mamba_d_conv", default=4),
            time_step_rank=_dt_rank(view, hidden),
            conv_bias=d.flag("mamba_conv_bias", True),
            in_bias=(bias := d.flag("mamba_proj_bias", False)),
            out_bias=bias,
            inner_norms=True,
            activation=act,
        )
    except ConfigError as exc:
        raise ConfigError(f"{view.source}: {exc}") from None


@register("jamba")
def parse_jamba(view: ConfigView) -> ModelSpec:
    """Jamba v0.1, 1.5 Mini/Large, 1.6/1.7 (``JambaForCausalLM``)."""
    d = ClassDefaults(view, "JambaConfig")
    hidden = d.integer("hidden_size", default=4096)
    layers = d.integer("num_hidden_layers", default=32, maximum=MAX_LAYERS)
    heads = d.integer("num_attention_heads", default=32)
    attention = AttentionSpec(
        num_heads=heads,
        num_kv_heads=kv_heads(view, d, heads, default=8),
        head_dim=read_head_dim(view, hidden, heads),
        dropout=d.number("attention_dropout", 0.0),
    )
    attn_period, attn_offset = _period(view, d, "attn", 8, 4)
    expert_period, expert_offset = _period(view, d, "expert", 2, 1)
    experts = d.integer("num_experts", "num_local_experts", default=16)
    act = d.text("hidden_act", default="silu")
    width = d.integer("intermediate_size", default=14336)
    layer_specs = tuple(
        LayerSpec(
            mixer=MixerKind.ATTENTION if i % attn_period == attn_offset else MixerKind.MAMBA,
            ffn=FfnKind.MOE if (experts > 1 and i % expert_period == expert_offset) else FfnKind.DENSE,
        )
        for i in range(layers)
    )
    moe = None
    if any(layer.moe for layer in layer_specs):
        moe = moe_spec(
            view,
            num_experts=experts,
            experts_per_token=d.integer("num_experts_per_tok", default=2),
            expert_intermediate_size=width,
            activation=act,
        )
    dense = any(layer.ffn is FfnKind.DENSE for layer in layer_specs)
    return build_spec(
        view,
        "jamba",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=d.integer("vocab_size", default=65536),
        attention=attention,
        mlp=MlpSpec(kind=MlpKind.GATED, intermediate_size=width, activation=act) if dense else None,
        moe=moe,
        mamba=_mamba(view, d, hidden, act) if any(layer.mixer is MixerKind.MAMBA for layer in layer_specs) else None,
        layers=layer_specs,
        position=PositionSpec(
            kind=PositionKind.NONE, max_positions=d.integer("max_position_embeddings", default=262144)
        ),
        tie_word_embeddings=d.flag("tie_word_embeddings", False),
    )
