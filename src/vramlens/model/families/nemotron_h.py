"""Nemotron-H (NVIDIA): a stack of single-purpose blocks, each one RMSNorm and one mixer.

``layers_block_type`` (or the legacy ``hybrid_override_pattern``, one character per block: ``M``
Mamba 2, ``*`` attention, ``-`` MLP, ``E`` MoE) names each block. Attention has no positional
encoding and no biases; the MLP is a plain ``up -> relu2 -> down``; MoE experts are plain MLPs
of ``moe_intermediate_size`` beside one plain shared expert, with a sigmoid router keeping a
score-correction bias as a buffer. Multi-token-prediction layers are not built by transformers
(their weights are ignored on load) and are not counted. Defaults are ``NemotronHConfig``'s,
each one used recorded in the assumptions. Source: transformers 5.x configuration_nemotron_h.py,
modeling_nemotron_h.py.
"""

from __future__ import annotations

from vramlens.model.config_reader import ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import build_spec, moe_spec
from vramlens.model.families._hybrid import ClassDefaults, block_types, kv_heads, mamba2_spec
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
from vramlens.model.ssm import MambaSpec

_BLOCKS = {
    "linear_attention": (MixerKind.MAMBA, FfnKind.NONE),
    "full_attention": (MixerKind.ATTENTION, FfnKind.NONE),
    "mlp": (MixerKind.NONE, FfnKind.DENSE),
    "moe": (MixerKind.NONE, FfnKind.MOE),
}
_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
_DEFAULT_BLOCKS = ("linear_attention", "moe", "full_attention", "mlp")


def _blocks(view: ConfigView, d: ClassDefaults) -> tuple[str, ...]:
    for key in ("layers_block_type", "layer_types"):
        if view.present(key):
            return block_types(view, key, layers=None, allowed=_BLOCKS)
    if view.present("hybrid_override_pattern"):
        pattern = view.text("hybrid_override_pattern")
        unknown = sorted(set(pattern) - set(_PATTERN))
        if unknown or not pattern:
            raise view.error("hybrid_override_pattern", f"has {unknown or 'no blocks'}; expected characters M * - E")
        return tuple(_PATTERN[c] for c in pattern)
    view.assumptions.append(f"'layers_block_type' not in config; using {list(_DEFAULT_BLOCKS)} ({d.why})")
    return _DEFAULT_BLOCKS


def _mamba(view: ConfigView, d: ClassDefaults) -> MambaSpec:
    heads = d.integer("mamba_num_heads", default=128)
    bias = d.flag("use_bias", False)
    return mamba2_spec(
        view,
        intermediate_size=heads * d.integer("mamba_head_dim", default=64),
        state_size=d.integer("ssm_state_size", default=128),
        conv_kernel=d.integer("mamba_d_conv", "conv_kernel", default=4),
        num_heads=heads,
        n_groups=d.integer("mamba_n_groups", "n_groups", default=8),
        chunk_size=d.integer("mamba_chunk_size", "chunk_size", default=128),
        conv_bias=view.flag("mamba_conv_bias", "use_conv_bias", default=True, why=d.why),
        in_bias=bias,
        out_bias=bias,
        gated_norm=True,
        activation=d.text("mamba_hidden_act", default="silu"),
    )


@register("nemotron_h")
def parse_nemotron_h(view: ConfigView) -> ModelSpec:
    """Nemotron-H 4B/8B/47B/56B, NVIDIA-Nemotron-Nano-9B/12B-v2, Nemotron-3 Nano (``NemotronHForCausalLM``)."""
    d = ClassDefaults(view, "NemotronHConfig")
    if view.present("moe_latent_size"):
        raise view.error("moe_latent_size", "is set: MoE latent projections are not modelled by vramlens yet")
    blocks = _blocks(view, d)
    layers = tuple(LayerSpec(mixer=_BLOCKS[b][0], ffn=_BLOCKS[b][1]) for b in blocks)
    heads = d.integer("num_attention_heads", default=32)
    attention = AttentionSpec(
        num_heads=heads,
        num_kv_heads=kv_heads(view, d, heads, default=8),
        head_dim=d.integer("head_dim", default=128),
        dropout=d.number("attention_dropout", 0.0),
    )
    act = d.text("mlp_hidden_act", default="relu2")
    mlp_bias = d.flag("mlp_bias", False)
    moe = None
    if any(layer.moe for layer in layers):
        moe = moe_spec(
            view,
            num_experts=d.integer("n_routed_experts", "num_local_experts", default=8),
            experts_per_token=d.integer("num_experts_per_tok", default=2),
            expert_intermediate_size=d.integer("moe_intermediate_size", default=7688),
            expert_kind=MlpKind.PLAIN,
            shared_intermediate_size=d.integer("moe_shared_expert_intermediate_size", default=7688),
            num_shared_experts=1,
            shared_kind=MlpKind.PLAIN,
            shared_bias=mlp_bias,
            router_score_bias=True,
            activation=act,
        )
    mtp = view.integer("num_nextn_predict_layers", default=0, minimum=0)
    if mtp:
        view.assumptions.append(
            f"the checkpoint's {mtp} multi-token-prediction layer(s) are not built by transformers (ignored on load) "
            "and are not counted"
        )
    dense = any(layer.ffn is FfnKind.DENSE for layer in layers)
    return build_spec(
        view,
        "nemotron_h",
        hidden_size=d.integer("hidden_size", default=4096),
        num_layers=len(layers),
        vocab_size=d.integer("vocab_size", default=131072),
        attention=attention,
        mlp=MlpSpec(
            kind=MlpKind.PLAIN,
            intermediate_size=d.integer("intermediate_size", default=21504),
            bias=mlp_bias,
            activation=act,
        )
        if dense
        else None,
        moe=moe,
        mamba=_mamba(view, d) if any(layer.mixer is MixerKind.MAMBA for layer in layers) else None,
        layers=layers,
        norms_per_layer=1,
        position=PositionSpec(kind=PositionKind.NONE, max_positions=d.integer("max_position_embeddings", default=4096)),
        tie_word_embeddings=d.flag("tie_word_embeddings", False),
    )
