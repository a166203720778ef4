"""GPT-style decoders with LayerNorm and plain (ungated) MLPs: GPT-2, GPT-NeoX/Pythia, Falcon, StarCoder2."""

from __future__ import annotations

from vramlens.model.config_reader import ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import (
    build_spec,
    layer_specs,
    read_head_dim,
    read_layers,
    read_position,
    standard_attention,
    windows_for_all,
    windows_none,
)
from vramlens.model.spec import AttentionSpec, MlpKind, MlpSpec, ModelSpec, NormKind, NormSpec, PositionKind

_LAYER_NORM = NormSpec(kind=NormKind.LAYERNORM, bias=True)


def _dropout(view: ConfigView, *keys: str, default: float = 0.0) -> float:
    return view.number(*keys, default=default, minimum=0.0, maximum=0.999)


@register("gpt2")
def parse_gpt2(view: ConfigView) -> ModelSpec:
    """GPT-2: learned positions, fused ``c_attn`` with biases, 4h MLP, tied head (``n_*`` keys)."""
    hidden = view.integer("n_embd", "hidden_size")
    layers = read_layers(view, "n_layer", "num_hidden_layers")
    attention = standard_attention(
        view,
        hidden,
        qkv_bias=True,
        out_bias=True,
        head_keys=("n_head", "num_attention_heads"),
        kv_keys=("n_head",),
        dropout_keys=("attn_pdrop",),
        dropout_default=(0.1, "GPT2Config default attn_pdrop"),
    )
    inner = view.integer("n_inner", default=4 * hidden, why="GPT-2 uses 4 * n_embd when n_inner is null")
    return build_spec(
        view,
        "gpt2",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=view.integer("vocab_size"),
        attention=attention,
        mlp=MlpSpec(
            kind=MlpKind.PLAIN,
            intermediate_size=inner,
            bias=True,
            activation=view.text("activation_function", default="gelu_new"),
        ),
        layers=layer_specs((None,) * layers),
        norm=_LAYER_NORM,
        position=read_position(view, kind=PositionKind.LEARNED, max_keys=("n_positions", "max_position_embeddings")),
        tie_word_embeddings=view.flag("tie_word_embeddings", default=True, why="GPT2Config default"),
        hidden_dropout=_dropout(view, "resid_pdrop", default=0.1),
        embedding_dropout=_dropout(view, "embd_pdrop", default=0.1),
    )


@register("gpt_neox")
def parse_gpt_neox(view: ConfigView) -> ModelSpec:
    """GPT-NeoX-20B and Pythia: parallel residual, fused qkv with bias, partial rotary (``rotary_pct``)."""
    hidden = view.integer("hidden_size")
    layers = read_layers(view, "num_hidden_layers")
    bias = view.flag("attention_bias", default=True)
    attention = standard_attention(view, hidden, qkv_bias=bias, out_bias=bias, kv_keys=("num_attention_heads",))
    return build_spec(
        view,
        "gpt_neox",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=view.integer("vocab_size"),
        attention=attention,
        mlp=MlpSpec(
            kind=MlpKind.PLAIN,
            intermediate_size=view.integer("intermediate_size"),
            bias=True,
            activation=view.text("hidden_act", default="gelu"),
        ),
        layers=layer_specs(windows_none(view, layers)),
        norm=_LAYER_NORM,
        position=read_position(view, rotary_keys=("rotary_pct", "partial_rotary_factor"), rotary_default=0.25),
        tie_word_embeddings=view.flag("tie_word_embeddings", default=False, why="GPTNeoXConfig default"),
        parallel_residual=view.flag("use_parallel_residual", default=True),
        hidden_dropout=_dropout(view, "hidden_dropout"),
    )


def _falcon_attention(view: ConfigView, hidden: int, *, new_arch: bool, bias: bool) -> AttentionSpec:
    """Falcon heads: new architecture -> ``num_kv_heads``; multi-query -> 1 KV head; else MHA."""
    heads = view.integer("num_attention_heads", "n_head")
    if new_arch:
        kv_heads = view.integer("num_kv_heads", "n_head_kv", default=heads)
    elif view.flag("multi_query", default=True, why="FalconConfig default"):
        kv_heads = 1
    else:
        kv_heads = heads
    if heads % kv_heads:
        raise view.error("num_kv_heads", f"must divide num_attention_heads ({heads}), got {kv_heads}")
    return AttentionSpec(
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=read_head_dim(view, hidden, heads),
        qkv_bias=bias,
        out_bias=bias,
        dropout=_dropout(view, "attention_dropout"),
    )


def _falcon_norms(view: ConfigView, *, new_arch: bool, parallel: bool) -> int:
    """LayerNorms per layer: 2 sequential; parallel: ``num_ln_in_parallel_attn`` (2 for the new architecture)."""
    if not parallel:
        return 2
    default = 2 if new_arch else 1
    return view.integer("num_ln_in_parallel_attn", default=default, maximum=2)


@register("falcon")
def parse_falcon(view: ConfigView) -> ModelSpec:
    """Falcon 7B/40B/180B (the legacy RefinedWeb configs come here through the alias table)."""
    hidden = view.integer("hidden_size", "n_embed")
    layers = read_layers(view, "num_hidden_layers", "n_layer")
    new_arch = view.flag("new_decoder_architecture", default=False)
    parallel = view.flag("parallel_attn", default=True, why="FalconConfig default")
    bias = view.flag("bias", default=False, why="FalconConfig default")
    alibi = view.flag("alibi", default=False)
    return build_spec(
        view,
        "falcon",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=view.integer("vocab_size"),
        attention=_falcon_attention(view, hidden, new_arch=new_arch, bias=bias),
        mlp=MlpSpec(
            kind=MlpKind.PLAIN,
            intermediate_size=view.integer("ffn_hidden_size", default=4 * hidden, why="Falcon uses 4 * hidden_size"),
            bias=bias,
            activation=view.text("activation", default="gelu"),
        ),
        layers=layer_specs((None,) * layers),
        norm=_LAYER_NORM,
        norms_per_layer=_falcon_norms(view, new_arch=new_arch, parallel=parallel),
        position=read_position(
            view,
            kind=PositionKind.ALIBI if alibi else PositionKind.ROPE,
            max_default=2048,
        ),
        tie_word_embeddings=view.flag("tie_word_embeddings", default=True, why="FalconConfig default"),
        parallel_residual=parallel or new_arch,
        hidden_dropout=_dropout(view, "hidden_dropout"),
    )


@register("starcoder2")
def parse_starcoder2(view: ConfigView) -> ModelSpec:
    """StarCoder2: GQA with biases (``use_bias``), LayerNorm, plain GELU MLP, sliding window."""
    hidden = view.integer("hidden_size")
    layers = read_layers(view, "num_hidden_layers")
    bias = view.flag("use_bias", default=True)
    attention = standard_attention(view, hidden, qkv_bias=bias, out_bias=bias)
    return build_spec(
        view,
        "starcoder2",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=view.integer("vocab_size"),
        attention=attention,
        mlp=MlpSpec(
            kind=MlpKind.PLAIN,
            intermediate_size=view.integer("intermediate_size"),
            bias=bias,
            activation=view.text("hidden_act", default="gelu_pytorch_tanh"),
        ),
        layers=layer_specs(windows_for_all(view, layers)),
        norm=_LAYER_NORM,
        position=read_position(view),
        tie_word_embeddings=view.flag("tie_word_embeddings", default=True, why="Starcoder2Config default"),
        hidden_dropout=_dropout(view, "residual_dropout"),
        embedding_dropout=_dropout(view, "embedding_dropout"),
    )
