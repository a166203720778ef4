"""Command R7B / Command A (Cohere ``cohere2``): parallel blocks, bias-free LayerNorm, sliding and NoPE global layers.

As transformers' ``Cohere2Config`` / ``modeling_cohere2.py`` (5.x) build it:

* one bias-free LayerNorm (``Cohere2LayerNorm``: weight only) per layer, read by attention and the
  SwiGLU MLP in parallel (``residual + attention(x) + mlp(x)``), and a final one;
* ``layer_types``: three ``sliding_window`` (4096) layers then one full layer (``sliding_window_pattern``,
  default 4); only the sliding layers apply rotary embeddings, the full layers are NoPE;
* ``head_dim`` is always ``hidden_size // num_attention_heads`` (``__post_init__`` overwrites any other);
* the head is tied to the embedding by default and its logits are multiplied by ``logit_scale``.

Absent keys take ``Cohere2Config``'s defaults, each recorded in the assumptions.
"""

from __future__ import annotations

from vramlens.model.config_reader import MAX_LAYERS, ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import build_spec, read_position
from vramlens.model.families._defaults import kv_heads, layer_type_list, nullable_integer, read_layer_count
from vramlens.model.spec import AttentionSpec, LayerSpec, MlpKind, MlpSpec, ModelSpec, NormKind, NormSpec

_WHY = "Cohere2Config default"


def _windows(view: ConfigView, layers: int) -> tuple[int | None, ...]:
    window = nullable_integer(view, "sliding_window", default=4096, why=_WHY)
    types = layer_type_list(view, layers, ("sliding_attention", "full_attention"))
    if types is None:
        pattern = view.integer("sliding_window_pattern", default=4, maximum=MAX_LAYERS, why=_WHY)
        types = tuple("sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers))
    if window is None and "sliding_attention" in types:
        raise view.error("sliding_window", "must be a positive integer when layers use sliding_attention")
    return tuple(window if kind == "sliding_attention" else None for kind in types)


@register("cohere2")
def parse_cohere2(view: ConfigView) -> ModelSpec:
    """Cohere2: parallel attention + MLP on one bias-free LayerNorm; RoPE only in sliding-window layers."""
    hidden = view.integer("hidden_size", default=8192, why=_WHY)
    layers = read_layer_count(view, default=40, why=_WHY)
    heads = view.integer("num_attention_heads", default=64, why=_WHY)
    if heads > hidden:
        raise view.error("num_attention_heads", f"must not exceed hidden_size {hidden} (head_dim = hidden / heads)")
    bias = view.flag("attention_bias", default=False, why=_WHY)
    attention = AttentionSpec(
        num_heads=heads,
        num_kv_heads=kv_heads(view, heads, default=None, why=_WHY),
        head_dim=hidden // heads,
        qkv_bias=bias,
        out_bias=bias,
        dropout=view.number("attention_dropout", default=0.0, minimum=0.0, maximum=0.999),
    )
    windows = _windows(view, layers)
    mlp = MlpSpec(
        kind=MlpKind.GATED,
        intermediate_size=view.integer("intermediate_size", default=22528, why=_WHY),
        activation=view.text("hidden_act", default="silu"),
    )
    return build_spec(
        view,
        "cohere2",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=view.integer("vocab_size", default=256000, why=_WHY),
        attention=attention,
        mlp=mlp,
        layers=tuple(LayerSpec(window=w, rope=w is not None) for w in windows),
        norm=NormSpec(kind=NormKind.LAYERNORM, bias=False),
        norms_per_layer=1,
        parallel_residual=True,
        position=read_position(view, max_default=8192),
        tie_word_embeddings=view.flag("tie_word_embeddings", default=True, why=_WHY),
    )
