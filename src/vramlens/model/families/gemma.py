"""Gemma, Gemma 2, Gemma 3 (text, and multimodal with its SigLIP vision tower).

Gemma: GeGLU MLP, head_dim 256 by default, tied embeddings. Gemma 2 adds
sandwich norms (4 RMSNorms per layer), alternating sliding-window/global layers
and logit soft-capping. Gemma 3 adds per-head q/k RMSNorm and a 5:1
local:global pattern. Absent keys take transformers' ``Gemma*Config`` defaults
(Gemma 3 multimodal configs rely on them for heads and vocab), recorded in the
spec's assumptions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vramlens.model.config_reader import MAX_LAYERS, ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import (
    build_spec,
    dense_gated_mlp,
    explicit_windows,
    layer_specs,
    read_layers,
    read_position,
    standard_attention,
    windows_none,
)
from vramlens.model.families.towers import siglip_vision
from vramlens.model.spec import ModelSpec, QKNorm

_DEFAULTS = "transformers' Gemma config default"


def _local_global_windows(view: ConfigView, layers: int, *, pattern: int) -> tuple[int | None, ...]:
    """``layer_types`` if given; else every ``pattern``-th layer global and the rest sliding."""
    window = view.integer("sliding_window", default=4096, why=_DEFAULTS)
    explicit = explicit_windows(view, layers, window)
    if explicit is not None:
        return explicit
    return tuple(window if (i + 1) % pattern else None for i in range(layers))


def _gemma(view: ConfigView, model_type: str, *, generation: int) -> ModelSpec:
    """Shared Gemma 1/2/3 decoder; ``generation`` picks norms, windows and defaults."""
    hidden = view.integer("hidden_size")
    layers = read_layers(view, "num_hidden_layers")
    bias = view.flag("attention_bias", default=False)
    attention = standard_attention(
        view,
        hidden,
        qkv_bias=bias,
        out_bias=bias,
        qk_norm=QKNorm.PER_HEAD if generation == 3 else QKNorm.NONE,
        head_dim_default=None if view.present("head_dim") else 256,
        head_dim_why=_DEFAULTS,
        heads_default=None if generation == 1 else (8, 4, _DEFAULTS),
    )
    attention = dataclasses.replace(attention, logit_softcap=view.opt_number("attn_logit_softcapping", minimum=0.0))
    if generation == 1:
        windows = windows_none(view, layers)
    else:
        pattern = 2 if generation == 2 else view.integer("sliding_window_pattern", default=6, maximum=MAX_LAYERS)
        windows = _local_global_windows(view, layers, pattern=pattern)
    vocab_default = 262208 if generation == 3 else None
    vocab = (
        view.integer("vocab_size")
        if vocab_default is None
        else view.integer("vocab_size", default=vocab_default, why=_DEFAULTS)
    )
    return build_spec(
        view,
        model_type,
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=vocab,
        attention=attention,
        mlp=dense_gated_mlp(view, act_default="gelu_pytorch_tanh"),
        layers=layer_specs(windows),
        norms_per_layer=2 if generation == 1 else 4,
        position=read_position(view, max_default=8192 if generation < 3 else 131072),
        tie_word_embeddings=view.flag("tie_word_embeddings", default=True, why=_DEFAULTS),
        final_logit_softcap=view.opt_number("final_logit_softcapping", minimum=0.0),
    )


@register("gemma")
def parse_gemma(view: ConfigView) -> ModelSpec:
    """Gemma 1 (2B, 7B)."""
    return _gemma(view, "gemma", generation=1)


@register("gemma2")
def parse_gemma2(view: ConfigView) -> ModelSpec:
    """Gemma 2 (2B, 9B, 27B)."""
    return _gemma(view, "gemma2", generation=2)


@register("gemma3_text")
def parse_gemma3_text(view: ConfigView) -> ModelSpec:
    """Gemma 3 text-only checkpoints (270M, 1B) and the text part of multimodal ones."""
    return _gemma(view, "gemma3_text", generation=3)


@register("gemma3")
def parse_gemma3(view: ConfigView) -> ModelSpec:
    """Gemma 3 multimodal (4B, 12B, 27B): the text decoder plus SigLIP vision tower and projector.

    Tower and projector: :func:`vramlens.model.families.towers.siglip_vision`.
    """
    text = view.sub("text_config")
    vision_view = view.sub("vision_config")
    if text is None or vision_view is None:
        missing = "text_config" if text is None else "vision_config"
        raise view.error(missing, "is required for model_type 'gemma3' (multimodal)")
    inherited: dict[str, Any] = {
        k: view.data[k] for k in ("torch_dtype", "dtype", "quantization_config") if k in view.data
    }
    text.data = {**inherited, **text.data}
    spec = parse_gemma3_text(text)
    vision = siglip_vision(vision_view, text_hidden=spec.hidden_size)
    return dataclasses.replace(
        spec, model_type="gemma3", source=view.source, assumptions=tuple(view.assumptions), vision=vision
    )
