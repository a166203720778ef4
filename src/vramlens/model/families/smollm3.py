"""SmolLM3 (HuggingFaceTB SmolLM3-3B): a Llama decoder whose every fourth layer has no rotary embedding.

As transformers' ``SmolLM3Config`` / ``modeling_smollm3.py`` (5.x) build it: Llama blocks (GQA,
SwiGLU, RMSNorm, tied embeddings by default); ``no_rope_layers[i]`` is 1 where layer ``i``
applies RoPE and 0 for a NoPE layer (default: every ``no_rope_layer_interval``-th layer, 4, is
NoPE). With ``use_sliding_window`` and a ``sliding_window``, the NoPE layers are
``sliding_attention`` layers unless ``layer_types`` says otherwise; the mask and the cache follow
``layer_types``. Absent keys take ``SmolLM3Config``'s defaults, each recorded in the assumptions.
"""

from __future__ import annotations

from vramlens.model.config_reader import MAX_LAYERS, ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import build_spec, read_position
from vramlens.model.families._defaults import floor_head_dim, kv_heads, layer_type_list, read_layer_count
from vramlens.model.spec import AttentionSpec, LayerSpec, MlpKind, MlpSpec, ModelSpec

_WHY = "SmolLM3Config default"


def _rope_flags(view: ConfigView, layers: int) -> tuple[bool, ...]:
    """Per layer: True where RoPE is applied (``no_rope_layers`` entries are 1 for RoPE, 0 for NoPE)."""
    flags = view.integers("no_rope_layers")
    if flags is None:
        interval = view.integer("no_rope_layer_interval", default=4, maximum=MAX_LAYERS, why=_WHY)
        return tuple((i + 1) % interval != 0 for i in range(layers))
    if len(flags) < layers:
        raise view.error("no_rope_layers", f"has {len(flags)} entries for {layers} layers")
    if any(flag > 1 for flag in flags):
        raise view.error("no_rope_layers", "must hold 1 (RoPE) or 0 (NoPE) per layer")
    return tuple(bool(flag) for flag in flags[:layers])


def _windows(view: ConfigView, rope: tuple[bool, ...]) -> tuple[int | None, ...]:
    use = view.flag("use_sliding_window", default=False, why=_WHY)
    window = view.opt_integer("sliding_window")
    types = layer_type_list(view, len(rope), ("sliding_attention", "full_attention"))
    if types is None:
        sliding = use and window is not None
        types = tuple("sliding_attention" if sliding and not r else "full_attention" for r in rope)
    if window is None and "sliding_attention" in types:
        raise view.error("sliding_window", "must be a positive integer when layers use sliding_attention")
    return tuple(window if kind == "sliding_attention" else None for kind in types)


@register("smollm3")
def parse_smollm3(view: ConfigView) -> ModelSpec:
    """SmolLM3: Llama blocks with NoPE layers (``no_rope_layers``)."""
    hidden = view.integer("hidden_size", default=2048, why=_WHY)
    layers = read_layer_count(view, default=36, why=_WHY)
    heads = view.integer("num_attention_heads", default=16, why=_WHY)
    bias = view.flag("attention_bias", default=False, why=_WHY)
    attention = AttentionSpec(
        num_heads=heads,
        num_kv_heads=kv_heads(view, heads, default=4, why=_WHY),
        head_dim=floor_head_dim(view, hidden, heads, code="SmolLM3Attention"),
        qkv_bias=bias,
        out_bias=bias,
        dropout=view.number("attention_dropout", default=0.0, minimum=0.0, maximum=0.999),
    )
    rope = _rope_flags(view, layers)
    windows = _windows(view, rope)
    mlp = MlpSpec(
        kind=MlpKind.GATED,
        intermediate_size=view.integer("intermediate_size", default=11008, why=_WHY),
        bias=view.flag("mlp_bias", default=False, why=_WHY),
        activation=view.text("hidden_act", default="silu"),
    )
    nope = sum(1 for r in rope if not r)
    if nope:
        view.assumptions.append(f"{nope} of {layers} layers are NoPE (no rotary embedding; no_rope_layers)")
    return build_spec(
        view,
        "smollm3",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=view.integer("vocab_size", default=128256, why=_WHY),
        attention=attention,
        mlp=mlp,
        layers=tuple(LayerSpec(window=w, rope=r) for w, r in zip(windows, rope, strict=True)),
        position=read_position(view, max_default=32768),
        tie_word_embeddings=view.flag("tie_word_embeddings", default=True, why=_WHY),
    )
