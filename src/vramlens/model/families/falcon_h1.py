"""Falcon-H1 (TII): in every layer a Mamba 2 mixer and attention read the same normed input side
by side and their outputs are summed, then a SwiGLU MLP.

The Mamba width is ``mamba_d_ssm`` (null: ``mamba_expand x hidden``), its gated RMSNorm exists only
with ``mamba_rms_norm``; ``out_proj`` has a bias with ``projectors_bias``. The muP multipliers
(``*_multiplier``, ``ssm_multipliers``) scale tensors and add no parameters. Defaults are
``FalconH1Config``'s, each one used recorded in the assumptions.
Source: transformers 5.x configuration_falcon_h1.py, modeling_falcon_h1.py.
"""

from __future__ import annotations

from vramlens.model.config_reader import MAX_LAYERS, ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import build_spec, read_head_dim, read_position
from vramlens.model.families._hybrid import ClassDefaults, kv_heads, mamba2_spec, mamba_head_dim
from vramlens.model.spec import AttentionSpec, LayerSpec, MixerKind, MlpKind, MlpSpec, ModelSpec
from vramlens.model.ssm import MambaSpec


def _mamba(view: ConfigView, d: ClassDefaults, hidden: int, act: str) -> MambaSpec:
    if "mamba_d_ssm" in view.data and view.data["mamba_d_ssm"] is None:
        inner = d.integer("mamba_expand", default=2) * hidden
    else:
        inner = d.integer("mamba_d_ssm", default=1024)
    heads = d.integer("mamba_n_heads", default=128)
    mamba_head_dim(view, "mamba_d_head", inner=inner, heads=heads, why=d.why)
    return mamba2_spec(
        view,
        intermediate_size=inner,
        state_size=d.integer("mamba_d_state", default=256),
        conv_kernel=d.integer("mamba_d_conv", default=4),
        num_heads=heads,
        n_groups=d.integer("mamba_n_groups", default=1),
        chunk_size=d.integer("mamba_chunk_size", default=256),
        conv_bias=d.flag("mamba_conv_bias", True),
        in_bias=d.flag("mamba_proj_bias", False),
        out_bias=d.flag("projectors_bias", False),
        gated_norm=d.flag("mamba_rms_norm", False),
        norm_before_gate=d.flag("mamba_norm_before_gate", True),
        activation=act,
    )


@register("falcon_h1")
def parse_falcon_h1(view: ConfigView) -> ModelSpec:
    """Falcon-H1 0.5B to 34B (``FalconH1ForCausalLM``)."""
    d = ClassDefaults(view, "FalconH1Config")
    hidden = d.integer("hidden_size", default=4096)
    layers = d.integer("num_hidden_layers", default=32, maximum=MAX_LAYERS)
    heads = d.integer("num_attention_heads", default=32)
    bias = d.flag("attention_bias", False)
    attention = AttentionSpec(
        num_heads=heads,
        num_kv_heads=kv_heads(view, d, heads, default=8),
        head_dim=read_head_dim(view, hidden, heads),
        qkv_bias=bias,
        out_bias=bias,
        dropout=d.number("attention_dropout", 0.0),
    )
    act = d.text("hidden_act", default="silu")
    mlp = MlpSpec(
        kind=MlpKind.GATED,
        intermediate_size=d.integer("intermediate_size", default=14336),
        bias=d.flag("mlp_bias", False),
        activation=act,
    )
    return build_spec(
        view,
        "falcon_h1",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=d.integer("vocab_size", default=128000),
        attention=attention,
        mlp=mlp,
        mamba=_mamba(view, d, hidden, act),
        layers=(LayerSpec(mixer=MixerKind.ATTENTION_AND_MAMBA),) * layers,
        position=read_position(view, max_default=8192),
        tie_word_embeddings=d.flag("tie_word_embeddings", False),
    )
