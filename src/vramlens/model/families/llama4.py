"""Llama 4: ``llama4_text`` (Scout, Maverick text decoder) and the ``llama4`` multimodal wrapper.

The decoder (transformers ``Llama4TextModel``) interleaves dense layers (a gated MLP of
width ``intermediate_size_mlp``) and MoE layers (``moe_layers``, else every
``interleave_moe_layer_step``-th layer): ``num_local_experts`` experts of width
``intermediate_size`` with a sigmoid top-k router and one always-on shared expert of the
same width. Layers with ``no_rope_layers[i] == 1`` apply rotary embeddings, a
parameter-free L2 norm on q and k (``use_qk_norm``) and chunked local attention
(``attention_chunk_size``: a query sees only keys of its own chunk); the others (every
fourth by default) are NoPE layers with full causal attention and attention-temperature
tuning. The wrapper (``Llama4ForConditionalGeneration``) adds the vision tower and projector
(:mod:`vramlens.model.families.towers`); its text model keeps its own
``tie_word_embeddings``. Defaults are ``Llama4TextConfig``'s, each one used recorded.
"""

from __future__ import annotations

from vramlens.model.config_reader import MAX_LAYERS, ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import build_spec, moe_spec, read_layers, read_position, standard_attention
from vramlens.model.families._nested import nested_parts, wrap_text_spec
from vramlens.model.families.towers import llama4_vision
from vramlens.model.spec import FfnKind, LayerSpec, MlpKind, MlpSpec, ModelSpec, QKNorm

_DEFAULTS = "transformers' Llama4TextConfig default"
_LAYER_TYPES = ("chunked_attention", "full_attention")


def _rope_layers(view: ConfigView, layers: int) -> tuple[bool, ...]:
    """``no_rope_layers`` (1 = rotary layer), else a NoPE layer every ``no_rope_layer_interval`` layers."""
    explicit = view.integers("no_rope_layers")
    if explicit:  # transformers treats an empty list as absent
        if len(explicit) < layers:
            raise view.error("no_rope_layers", f"has {len(explicit)} entries for {layers} layers")
        if any(flag not in (0, 1) for flag in explicit):
            raise view.error("no_rope_layers", "must hold only 0 (NoPE layer) and 1 (rotary layer)")
        return tuple(bool(flag) for flag in explicit[:layers])
    interval = view.integer("no_rope_layer_interval", default=4, maximum=MAX_LAYERS, why=_DEFAULTS)
    return tuple((i + 1) % interval != 0 for i in range(layers))


def _chunked(view: ConfigView, rope: tuple[bool, ...]) -> tuple[bool, ...]:
    """Which layers use chunked attention: ``layer_types``, else the rotary layers."""
    types = view.texts("layer_types")
    if types is None:
        return rope
    if len(types) != len(rope):
        raise view.error("layer_types", f"has {len(types)} entries for {len(rope)} layers")
    unknown = sorted({t for t in types if t not in _LAYER_TYPES})
    if unknown:
        raise view.error("layer_types", f"has unsupported {', '.join(unknown)}; expected {', '.join(_LAYER_TYPES)}")
    return tuple(t == "chunked_attention" for t in types)


def _moe_layers(view: ConfigView, layers: int) -> frozenset[int]:
    explicit = view.integers("moe_layers")
    if explicit is not None:
        outside = sorted(i for i in explicit if i >= layers)
        if outside:
            raise view.error("moe_layers", f"names layer {outside[0]} of a {layers}-layer model")
        return frozenset(explicit)
    step = view.integer("interleave_moe_layer_step", default=1, maximum=MAX_LAYERS, why=_DEFAULTS)
    return frozenset(range(step - 1, layers, step))


def _layer_specs(view: ConfigView, layers: int) -> tuple[LayerSpec, ...]:
    rope = _rope_layers(view, layers)
    chunked = _chunked(view, rope)
    chunk: int | None = None
    if "attention_chunk_size" not in view.data or view.data["attention_chunk_size"] is not None:
        chunk = view.integer("attention_chunk_size", default=8192, why=_DEFAULTS)
    if chunk is None and any(chunked):
        raise view.error("attention_chunk_size", "must be a positive integer when layers use chunked attention")
    moe = _moe_layers(view, layers)
    return tuple(
        LayerSpec(
            chunk=chunk if chunked[i] else None,
            rope=rope[i],
            ffn=FfnKind.MOE if i in moe else FfnKind.DENSE,
        )
        for i in range(layers)
    )


@register("llama4_text")
def parse_llama4_text(view: ConfigView) -> ModelSpec:
    """Llama 4 text decoder (``Llama4ForCausalLM``): interleaved MoE with a shared expert,
    chunked attention and NoPE layers; q/k L2 norms have no parameters."""
    hidden = view.integer("hidden_size")
    layers = _layer_specs(view, read_layers(view, "num_hidden_layers"))
    bias = view.flag("attention_bias", default=False, why=_DEFAULTS)
    qk_norm = QKNorm.L2 if view.flag("use_qk_norm", default=True, why=_DEFAULTS) else QKNorm.NONE
    attention = standard_attention(
        view,
        hidden,
        qkv_bias=bias,
        out_bias=bias,
        qk_norm=qk_norm,
        head_dim_default=None if view.present("head_dim") else 128,
        head_dim_why=_DEFAULTS,
    )
    activation = view.text("hidden_act", default="silu", why=_DEFAULTS)
    expert_width = view.integer("intermediate_size")
    uses_moe = any(layer.moe for layer in layers)
    moe = None
    if uses_moe:
        moe = moe_spec(
            view,
            num_experts=view.integer("num_local_experts", default=16, why=_DEFAULTS),
            experts_per_token=view.integer("num_experts_per_tok", default=1, why=_DEFAULTS),
            expert_intermediate_size=expert_width,
            shared_intermediate_size=expert_width,
            num_shared_experts=1,
            activation=activation,
        )
    mlp = None
    if not all(layer.moe for layer in layers):
        mlp = MlpSpec(
            kind=MlpKind.GATED,
            intermediate_size=view.integer("intermediate_size_mlp", default=16384, why=_DEFAULTS),
            activation=activation,
        )
    return build_spec(
        view,
        "llama4_text",
        hidden_size=hidden,
        num_layers=len(layers),
        vocab_size=view.integer("vocab_size"),
        attention=attention,
        mlp=mlp,
        moe=moe,
        layers=layers,
        position=read_position(view, max_default=131072),
        tie_word_embeddings=view.flag("tie_word_embeddings", default=False, why=_DEFAULTS),
    )


@register("llama4")
def parse_llama4(view: ConfigView) -> ModelSpec:
    """Llama 4 multimodal (``Llama4ForConditionalGeneration``): the ``text_config`` decoder,
    the vision tower and the projector. Its language model ties (or not) by its own
    ``text_config.tie_word_embeddings``; the wrapper's key is not read for tying."""
    text, vision_view = nested_parts(view, "llama4")
    spec = parse_llama4_text(text)
    vision = llama4_vision(vision_view, text_hidden=spec.hidden_size)
    return wrap_text_spec(view, "llama4", spec, vision, tie_word_embeddings=spec.tie_word_embeddings)
