"""Llama-style decoders: Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE, OLMo 2.

Pre-norm RMSNorm blocks, rotary positions, gated (SwiGLU) MLPs; they differ in
biases, q/k norms, head size defaults, sliding windows and MoE placement.
Defaults for absent keys are those of the transformers config classes
(``LlamaConfig``, ``Qwen3Config``, ...), and each one used is recorded in the
spec's assumptions.
"""

from __future__ import annotations

from collections.abc import Callable

from vramlens.model.config_reader import ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import (
    build_spec,
    dense_gated_mlp,
    layer_specs,
    moe_every,
    moe_spec,
    read_layers,
    read_position,
    standard_attention,
    windows_for_all,
    windows_none,
    windows_qwen,
)
from vramlens.model.spec import AttentionSpec, ModelSpec, MoeSpec, QKNorm

_TIE_DEFAULT = "transformers' default for this model_type"


def _decoder(
    view: ConfigView,
    model_type: str,
    attention: AttentionSpec,
    windows: tuple[int | None, ...],
    *,
    moe: MoeSpec | None = None,
    moe_rule: Callable[[int], bool] | None = None,
    dense: bool = True,
    mlp_bias: bool = False,
) -> ModelSpec:
    """Assemble a Llama-style spec (RMSNorm, rotary, untied by default)."""
    layers = len(windows)
    return build_spec(
        view,
        model_type,
        hidden_size=view.integer("hidden_size"),
        num_layers=layers,
        vocab_size=view.integer("vocab_size"),
        attention=attention,
        mlp=dense_gated_mlp(view, bias=mlp_bias) if dense else None,
        moe=moe,
        layers=layer_specs(windows, moe_rule),
        position=read_position(view),
        tie_word_embeddings=view.flag("tie_word_embeddings", default=False, why=_TIE_DEFAULT),
    )


@register("llama")
def parse_llama(view: ConfigView) -> ModelSpec:
    """Llama 2/3/3.1/3.2/3.3 and compatible: ``attention_bias`` on q/k/v/o, ``mlp_bias``."""
    hidden = view.integer("hidden_size")
    bias = view.flag("attention_bias", default=False)
    attention = standard_attention(view, hidden, qkv_bias=bias, out_bias=bias)
    windows = windows_none(view, read_layers(view, "num_hidden_layers"))
    return _decoder(view, "llama", attention, windows, mlp_bias=view.flag("mlp_bias", default=False))


@register("mistral")
def parse_mistral(view: ConfigView) -> ModelSpec:
    """Mistral 7B / Nemo: no biases, optional ``sliding_window`` on every layer, explicit ``head_dim`` (Nemo)."""
    hidden = view.integer("hidden_size")
    attention = standard_attention(view, hidden, qkv_bias=False, out_bias=False)
    windows = windows_for_all(view, read_layers(view, "num_hidden_layers"))
    return _decoder(view, "mistral", attention, windows)


@register("mixtral")
def parse_mixtral(view: ConfigView) -> ModelSpec:
    """Mixtral: every layer is MoE with ``num_local_experts`` experts of width ``intermediate_size``."""
    hidden = view.integer("hidden_size")
    attention = standard_attention(view, hidden, qkv_bias=False, out_bias=False)
    windows = windows_for_all(view, read_layers(view, "num_hidden_layers"))
    moe = moe_spec(
        view,
        num_experts=view.integer("num_local_experts"),
        experts_per_token=view.integer("num_experts_per_tok", default=2, why="MixtralConfig default"),
        expert_intermediate_size=view.integer("intermediate_size"),
        activation=view.text("hidden_act", default="silu"),
    )
    return _decoder(view, "mixtral", attention, windows, moe=moe, moe_rule=lambda i: True, dense=False)


@register("qwen2")
def parse_qwen2(view: ConfigView) -> ModelSpec:
    """Qwen2 / Qwen2.5: biases on q/k/v only; Qwen sliding-window rule."""
    hidden = view.integer("hidden_size")
    attention = standard_attention(view, hidden, qkv_bias=True, out_bias=False)
    windows = windows_qwen(view, read_layers(view, "num_hidden_layers"))
    return _decoder(view, "qwen2", attention, windows)


def _qwen_moe_block(
    view: ConfigView, *, shared: bool, experts_default: int, topk_default: int, width_default: int
) -> MoeSpec:
    shared_width = view.integer("shared_expert_intermediate_size", default=0, minimum=0) if shared else 0
    return moe_spec(
        view,
        num_experts=view.integer(
            "num_experts", "num_local_experts", default=experts_default, why="transformers config default"
        ),
        experts_per_token=view.integer("num_experts_per_tok", default=topk_default, why="transformers config default"),
        expert_intermediate_size=view.integer(
            "moe_intermediate_size", default=width_default, why="transformers config default"
        ),
        shared_intermediate_size=shared_width,
        num_shared_experts=1 if shared else 0,
        shared_expert_gate=shared,
        activation=view.text("hidden_act", default="silu"),
    )


@register("qwen2_moe")
def parse_qwen2_moe(view: ConfigView) -> ModelSpec:
    """Qwen1.5-MoE / Qwen2-MoE: routed experts plus a gated shared expert; ``qkv_bias``."""
    hidden = view.integer("hidden_size")
    bias = view.flag("qkv_bias", default=True)
    attention = standard_attention(view, hidden, qkv_bias=bias, out_bias=False)
    layers = read_layers(view, "num_hidden_layers")
    windows = windows_qwen(view, layers)
    moe = _qwen_moe_block(view, shared=True, experts_default=60, topk_default=4, width_default=1408)
    rule = moe_every(view, layers)
    needs_dense = any(not rule(i) for i in range(layers))
    return _decoder(view, "qwen2_moe", attention, windows, moe=moe, moe_rule=rule, dense=needs_dense)


def _qwen3_attention(view: ConfigView, hidden: int, *, head_dim_default: int | None) -> AttentionSpec:
    """Qwen3 attention; an absent ``head_dim`` is 128 in ``Qwen3Config`` and ``hidden / heads`` in
    ``Qwen3MoeConfig`` (transformers 5: its ``head_dim`` defaults to None)."""
    bias = view.flag("attention_bias", default=False)
    absent = not view.present("head_dim")
    return standard_attention(
        view,
        hidden,
        qkv_bias=bias,
        out_bias=bias,
        qk_norm=QKNorm.PER_HEAD,
        head_dim_default=head_dim_default if absent else None,
        head_dim_why="Qwen3Config default" if absent and head_dim_default else None,
    )


@register("qwen3")
def parse_qwen3(view: ConfigView) -> ModelSpec:
    """Qwen3 dense: per-head RMSNorm on q and k, explicit ``head_dim`` (default 128)."""
    hidden = view.integer("hidden_size")
    attention = _qwen3_attention(view, hidden, head_dim_default=128)
    windows = windows_qwen(view, read_layers(view, "num_hidden_layers"))
    return _decoder(view, "qwen3", attention, windows)


@register("qwen3_moe")
def parse_qwen3_moe(view: ConfigView) -> ModelSpec:
    """Qwen3 MoE: Qwen3 attention, routed experts without a shared expert."""
    hidden = view.integer("hidden_size")
    attention = _qwen3_attention(view, hidden, head_dim_default=None)
    layers = read_layers(view, "num_hidden_layers")
    windows = windows_qwen(view, layers)
    moe = _qwen_moe_block(view, shared=False, experts_default=128, topk_default=8, width_default=768)
    rule = moe_every(view, layers)
    needs_dense = any(not rule(i) for i in range(layers))
    return _decoder(view, "qwen3_moe", attention, windows, moe=moe, moe_rule=rule, dense=needs_dense)


@register("olmo2")
def parse_olmo2(view: ConfigView) -> ModelSpec:
    """OLMo 2: RMSNorm over the whole q and k projections; post-attention and post-FFN norms."""
    hidden = view.integer("hidden_size")
    bias = view.flag("attention_bias", default=False)
    attention = standard_attention(view, hidden, qkv_bias=bias, out_bias=bias, qk_norm=QKNorm.PER_PROJECTION)
    windows = windows_none(view, read_layers(view, "num_hidden_layers"))
    return _decoder(view, "olmo2", attention, windows)
