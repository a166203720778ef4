"""Granite 4.0-H (IBM, ``granitemoehybrid``): Mamba 2 and attention layers, each followed by an MoE
block beside an always-on shared MLP (or the shared MLP alone when ``num_local_experts`` is 0).

``layer_types`` names each layer (``mamba`` / ``attention``, or the new names; absent: every layer
Mamba). Experts are SwiGLU of ``intermediate_size``; the shared MLP is one fused ``input_linear``
(``h -> 2 x shared_intermediate_size``) and ``output_linear``. Rotary positions only with
``position_embedding_type: rope``. The muP-style multipliers add no parameters. Defaults are
``GraniteMoeHybridConfig``'s, each one used recorded in the assumptions.
Source: transformers 5.x configuration_granitemoehybrid.py, modeling_granitemoehybrid.py.
"""

from __future__ import annotations

from vramlens.model.config_reader import MAX_LAYERS, ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import build_spec, moe_spec, read_head_dim, read_position
from vramlens.model.families._hybrid import (
    ClassDefaults,
    block_types,
    kv_heads,
    layers_from_types,
    mamba2_spec,
    mamba_head_dim,
)
from vramlens.model.spec import (
    AttentionSpec,
    FfnKind,
    MixerKind,
    MlpKind,
    MlpSpec,
    ModelSpec,
    PositionKind,
    PositionSpec,
)
from vramlens.model.ssm import MambaSpec

_MIXERS = {"linear_attention": MixerKind.MAMBA, "full_attention": MixerKind.ATTENTION}


def _mamba(view: ConfigView, d: ClassDefaults, hidden: int, act: str) -> MambaSpec:
    inner = d.integer("mamba_expand", default=2) * hidden
    heads = d.integer("mamba_n_heads", default=128)
    mamba_head_dim(view, "mamba_d_head", inner=inner, heads=heads, why=d.why)
    bias = d.flag("mamba_proj_bias", False)
    return mamba2_spec(
        view,
        intermediate_size=inner,
        state_size=d.integer("mamba_d_state", default=256),
        conv_kernel=d.integer("mamba_d_conv", default=4),
        num_heads=heads,
        n_groups=d.integer("mamba_n_groups", default=1),
        chunk_size=d.integer("mamba_chunk_size", default=256),
        conv_bias=d.flag("mamba_conv_bias", True),
        in_bias=bias,
        out_bias=bias,
        gated_norm=True,
        activation=act,
    )


def _types(view: ConfigView, layers: int) -> tuple[str, ...]:
    if view.present("layer_types", "layers_block_type"):
        key = "layer_types" if view.present("layer_types") else "layers_block_type"
        return block_types(view, key, layers=layers, allowed=_MIXERS)
    view.assumptions.append("'layer_types' not in config; every layer is Mamba (GraniteMoeHybridConfig default)")
    return ("linear_attention",) * layers


def _position(view: ConfigView, d: ClassDefaults) -> PositionSpec:
    kind = view.data.get("position_embedding_type")
    if kind not in (None, "rope"):
        raise view.error("position_embedding_type", f"must be null or 'rope', got {kind!r}")
    if kind is None:
        return PositionSpec(kind=PositionKind.NONE, max_positions=d.integer("max_position_embeddings", default=2048))
    return read_position(view, max_default=2048)


@register("granitemoehybrid")
def parse_granitemoehybrid(view: ConfigView) -> ModelSpec:
    """Granite 4.0-H Micro/Tiny/Small (``GraniteMoeHybridForCausalLM``)."""
    d = ClassDefaults(view, "GraniteMoeHybridConfig")
    hidden = d.integer("hidden_size", default=4096)
    layers = d.integer("num_hidden_layers", default=32, maximum=MAX_LAYERS)
    heads = d.integer("num_attention_heads", default=32)
    bias = d.flag("attention_bias", False)
    attention = AttentionSpec(
        num_heads=heads,
        num_kv_heads=kv_heads(view, d, heads, default=None),
        head_dim=read_head_dim(view, hidden, heads),
        qkv_bias=bias,
        out_bias=bias,
        dropout=d.number("attention_dropout", 0.0),
    )
    act = d.text("hidden_act", default="silu")
    experts = d.integer("num_local_experts", default=8, minimum=0)
    shared = d.integer("shared_intermediate_size", default=1024)
    types = _types(view, layers)
    moe = mlp = None
    if experts:
        moe = moe_spec(
            view,
            num_experts=experts,
            experts_per_token=d.integer("num_experts_per_tok", default=2),
            expert_intermediate_size=d.integer("intermediate_size", default=11008),
            shared_intermediate_size=shared,
            num_shared_experts=1,
            activation=act,
        )
    else:
        mlp = MlpSpec(kind=MlpKind.GATED, intermediate_size=shared, activation=act)
    mamba = _mamba(view, d, hidden, act) if "linear_attention" in types else None
    return build_spec(
        view,
        "granitemoehybrid",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=d.integer("vocab_size", default=32000),
        attention=attention,
        mlp=mlp,
        moe=moe,
        mamba=mamba,
        layers=layers_from_types(types, _MIXERS, FfnKind.MOE if experts else FfnKind.DENSE),
        position=_position(view, d),
        tie_word_embeddings=d.flag("tie_word_embeddings", False),
    )
