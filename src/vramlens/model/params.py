"""Parameter counts of a :class:`ModelSpec`, component by component.

Every function is pure and counts *elements* (not bytes). The counting rules
follow the module structure of the Hugging Face ``transformers`` implementations
(``nn.Linear(in, out, bias)`` holds ``in*out (+out)`` parameters; a norm of
width ``w`` holds ``w``, or ``2w`` with a bias); the catalog test checks every
bundled model against ``transformers`` built on the meta device, to the
parameter. Buffers (rotary ``inv_freq``, DeepSeek-V3's router score-correction
bias) are not parameters and are reported separately.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from vramlens.errors import ConfigError
from vramlens.model.breakdown import ParameterBreakdown, generic_breakdown
from vramlens.model.spec import FfnKind, LayerKind, MixerKind, MlpKind, NormKind, NormSpec, PositionKind, QKNorm
from vramlens.model.ssm import MambaVersion

if TYPE_CHECKING:
    from vramlens.model.spec import AttentionSpec, LinearAttentionSpec, MambaSpec, MlaSpec, MlpSpec, ModelSpec, MoeSpec

_RMS = NormSpec(kind=NormKind.RMSNORM)

__all__ = [
    "ParameterBreakdown",
    "active_parameters",
    "attention_parameters",
    "expert_parameters",
    "ffn_parameters",
    "gated_deltanet_parameters",
    "layer_parameters",
    "linear_parameters",
    "mla_attention_parameters",
    "mixer_parameters",
    "mlp_parameters",
    "moe_parameters",
    "norm_parameters",
    "parameter_breakdown",
    "register_mixer_parameters",
]


def linear_parameters(in_features: int, out_features: int, *, bias: bool) -> int:
    """Elements of ``nn.Linear(in_features, out_features, bias)``: ``in*out`` (+ ``out`` with bias)."""
    return in_features * out_features + (out_features if bias else 0)


def norm_parameters(norm: NormSpec, width: int) -> int:
    """Elements of one norm over ``width`` features: weight (``width``), plus bias for LayerNorm with bias."""
    return width * (2 if norm.kind is NormKind.LAYERNORM and norm.bias else 1)


def mla_attention_parameters(mla: MlaSpec, *, num_heads: int, hidden: int, bias: bool, out_bias: bool) -> int:
    """Elements of one DeepSeek MLA block.

    ``q_a_proj (h -> q_rank) + q_a_layernorm + q_b_proj (q_rank -> H*(nope+rope))``
    (or ``q_proj (h -> H*(nope+rope))`` without a query rank),
    ``kv_a_proj_with_mqa (h -> kv_rank + rope) + kv_a_layernorm``,
    ``kv_b_proj (kv_rank -> H*(nope+v))``, ``o_proj (H*v -> h)``.
    Source: transformers ``DeepseekV3Attention``; DeepSeek-V2 report §2.1.
    """
    rms = _RMS
    q_out = num_heads * mla.qk_head_dim
    if mla.q_lora_rank is None:
        query = linear_parameters(hidden, q_out, bias=False)
    else:
        query = (
            linear_parameters(hidden, mla.q_lora_rank, bias=bias)
            + norm_parameters(rms, mla.q_lora_rank)
            + linear_parameters(mla.q_lora_rank, q_out, bias=False)
        )
    kv_a = linear_parameters(hidden, mla.kv_lora_rank + mla.qk_rope_head_dim, bias=bias)
    kv_norm = norm_parameters(rms, mla.kv_lora_rank)
    kv_b = linear_parameters(mla.kv_lora_rank, num_heads * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False)
    out = linear_parameters(num_heads * mla.v_head_dim, hidden, bias=out_bias)
    return query + kv_a + kv_norm + kv_b + out


def attention_parameters(attention: AttentionSpec, hidden: int) -> int:
    """Elements of one self-attention block: q, k, v, o projections and any q/k norms.

    ``q: h -> H*d``, ``k, v: h -> Hkv*d``, ``o: H*d -> h`` (fused qkv layouts
    such as Phi-3's ``qkv_proj`` or Falcon's ``query_key_value`` hold the same
    count). Q/K norms: per-head adds ``2*norm(d)``; per-projection adds
    ``norm(H*d) + norm(Hkv*d)``. Attention sinks (gpt-oss) add one logit per head; an output
    gate (Qwen3-Next) doubles the query projection.
    """
    if attention.mla is not None:
        return mla_attention_parameters(
            attention.mla,
            num_heads=attention.num_heads,
            hidden=hidden,
            bias=attention.qkv_bias,
            out_bias=attention.out_bias,
        )
    q_width = attention.num_heads * attention.head_dim
    kv_width = attention.num_kv_heads * attention.head_dim
    q_out = 2 * q_width if attention.output_gate else q_width  # Qwen3-Next: queries and their gates
    projections = (
        linear_parameters(hidden, q_out, bias=attention.qkv_bias)
        + 2 * linear_parameters(hidden, kv_width, bias=attention.qkv_bias)
        + linear_parameters(q_width, hidden, bias=attention.out_bias)
    )
    if attention.qk_norm is QKNorm.PER_HEAD:
        projections += 2 * norm_parameters(attention.qk_norm_spec, attention.head_dim)
    elif attention.qk_norm is QKNorm.PER_PROJECTION:
        projections += norm_parameters(attention.qk_norm_spec, q_width) + norm_parameters(
            attention.qk_norm_spec, kv_width
        )
    if attention.sinks:
        projections += attention.num_heads
    return projections


def mamba_parameters(mamba: MambaSpec, hidden: int) -> int:
    """Elements of one Mamba mixer (``d`` = ``d_inner``, ``N`` = ``d_state``, ``k`` = ``d_conv``).

    Mamba 1 (``JambaMambaMixer``): ``in_proj h -> 2d``, ``conv1d`` ``d x k`` (+ ``d`` bias),
    ``x_proj d -> R + 2N``, ``dt_proj R -> d`` with bias, ``A_log d x N``, ``D d``,
    ``out_proj d -> h``, and Jamba's RMSNorms of widths ``R``, ``N``, ``N``.
    Mamba 2 (``FalconH1Mixer``, ``NemotronHMamba2Mixer``, ``GraniteMoeHybridMambaLayer``):
    ``in_proj h -> d + (d + 2GN) + H``, ``conv1d`` ``(d + 2GN) x k`` (+ bias), ``dt_bias``,
    ``A_log`` and ``D`` of ``H`` each, the gated RMSNorm ``d``, ``out_proj d -> h``.
    """
    d, n = mamba.intermediate_size, mamba.state_size
    conv = mamba.conv_dim * mamba.conv_kernel + (mamba.conv_dim if mamba.conv_bias else 0)
    common = (
        linear_parameters(hidden, mamba.in_proj_size, bias=mamba.in_bias)
        + conv
        + linear_parameters(d, hidden, bias=mamba.out_bias)
    )
    if mamba.version is MambaVersion.MAMBA1:
        r = mamba.time_step_rank
        ssm = linear_parameters(d, r + 2 * n, bias=False) + linear_parameters(r, d, bias=True) + d * n + d
        return common + ssm + (r + 2 * n if mamba.inner_norms else 0)
    return common + 3 * mamba.num_heads + (d if mamba.gated_norm else 0)


def gated_deltanet_parameters(linear: LinearAttentionSpec, hidden: int) -> int:
    """Elements of one gated DeltaNet (``Qwen3NextGatedDeltaNet``): ``in_proj_qkvz h -> 2K + 2V``,
    ``in_proj_ba h -> 2 Hv``, a bias-free ``conv1d`` ``(2K + V) x k``, ``dt_bias`` and ``A_log``
    (``Hv`` each), the gated RMSNorm of one value head, ``out_proj V -> h`` (``K`` = key heads x
    key head size, ``V`` = value heads x value head size)."""
    k, v = linear.key_dim, linear.value_dim
    return (
        linear_parameters(hidden, 2 * k + 2 * v, bias=False)
        + linear_parameters(hidden, 2 * linear.num_value_heads, bias=False)
        + linear.conv_dim * linear.conv_kernel
        + 2 * linear.num_value_heads
        + linear.value_head_dim
        + linear_parameters(v, hidden, bias=False)
    )


def _ffn_parameters(kind: MlpKind, hidden: int, inner: int, *, bias: bool) -> int:
    """Gated: gate and up (h -> i) and down (i -> h). Plain: up (h -> i) and down (i -> h)."""
    up_matrices = 2 if kind is MlpKind.GATED else 1
    return up_matrices * linear_parameters(hidden, inner, bias=bias) + linear_parameters(inner, hidden, bias=bias)


def mlp_parameters(mlp: MlpSpec, hidden: int) -> int:
    """Elements of one dense MLP: ``3*h*i`` gated or ``2*h*i`` plain, plus biases."""
    return _ffn_parameters(mlp.kind, hidden, mlp.intermediate_size, bias=mlp.bias)


def expert_parameters(moe: MoeSpec, hidden: int) -> int:
    """Elements of one routed expert: an MLP of width ``expert_intermediate_size``, with biases
    when ``expert_bias`` (gpt-oss ``gate_up_proj_bias`` [2i] and ``down_proj_bias`` [h])."""
    return _ffn_parameters(moe.expert_kind, hidden, moe.expert_intermediate_size, bias=moe.expert_bias)


def moe_parameters(moe: MoeSpec, hidden: int) -> tuple[int, int, int]:
    """Elements of one MoE block as ``(routed experts, shared experts + shared gate, router)``.

    Router: ``E*h`` (an ``h -> E`` linear, ``+E`` with gpt-oss's bias). Shared experts: one gated
    MLP of the total shared width, plus Qwen2-MoE's ``h -> 1`` shared gate.
    """
    routed = moe.num_experts * expert_parameters(moe, hidden)
    shared = 0
    if moe.shared_intermediate_size:
        shared = _ffn_parameters(moe.shared_kind, hidden, moe.shared_intermediate_size, bias=moe.shared_bias)
    if moe.shared_expert_gate:
        shared += linear_parameters(hidden, 1, bias=False)
    router = linear_parameters(hidden, moe.num_experts, bias=moe.router_bias)
    return routed, shared, router


#: Elements of one layer's token mixer, by ParameterBreakdown slot (attention, ssm, linear_attention).
MixerCounter = Callable[["ModelSpec"], Mapping[str, int]]


def _mamba(spec: ModelSpec) -> Mapping[str, int]:
    assert spec.mamba is not None  # ModelSpec checks that Mamba layers have a Mamba mixer
    return {"ssm": mamba_parameters(spec.mamba, spec.hidden_size)}


def _linear_attention(spec: ModelSpec) -> Mapping[str, int]:
    assert spec.linear_attention is not None  # ModelSpec checks it
    return {"linear_attention": gated_deltanet_parameters(spec.linear_attention, spec.hidden_size)}


def _attention(spec: ModelSpec) -> Mapping[str, int]:
    return {"attention": attention_parameters(spec.attn, spec.hidden_size)}


_MIXER_PARAMETERS: dict[MixerKind, MixerCounter] = {
    MixerKind.ATTENTION: _attention,
    MixerKind.MAMBA: _mamba,
    MixerKind.LINEAR_ATTENTION: _linear_attention,
    MixerKind.ATTENTION_AND_MAMBA: lambda spec: {**_attention(spec), **_mamba(spec)},
    MixerKind.NONE: lambda spec: {},
}


def _dense(spec: ModelSpec) -> Mapping[str, int]:
    assert spec.mlp is not None  # ModelSpec checks that dense layers have an MLP
    return {"mlp": mlp_parameters(spec.mlp, spec.hidden_size)}


def _moe(spec: ModelSpec) -> Mapping[str, int]:
    assert spec.moe is not None  # ModelSpec checks that MoE layers have an MoE block
    routed, shared, router = moe_parameters(spec.moe, spec.hidden_size)
    return {"moe_experts": routed, "moe_shared": shared, "moe_router": router}


_FFN_PARAMETERS: dict[FfnKind, Callable[[ModelSpec], Mapping[str, int]]] = {
    FfnKind.DENSE: _dense,
    FfnKind.MOE: _moe,
    FfnKind.NONE: lambda spec: {},
}


def register_mixer_parameters(kind: MixerKind, counter: MixerCounter) -> None:
    """Register the parameter count of a token mixer (a new mixer is an entry, not an ``elif``)."""
    _MIXER_PARAMETERS[kind] = counter


def mixer_parameters(spec: ModelSpec, mixer: MixerKind) -> Mapping[str, int]:
    """Elements of one layer's ``mixer`` by breakdown slot; a mixer without a counting rule is a
    one-line :class:`ConfigError`, never counted as attention."""
    counter = _MIXER_PARAMETERS.get(mixer)
    if counter is None:
        raise ConfigError(f"{spec.name}: layers with a {mixer.value} token mixer are not modelled by vramlens")
    return counter(spec)


def ffn_parameters(spec: ModelSpec, ffn: FfnKind) -> Mapping[str, int]:
    """Elements of one layer's feed-forward block by breakdown slot (mlp, moe_experts, moe_shared, moe_router)."""
    return _FFN_PARAMETERS[ffn](spec)


def layer_parameters(spec: ModelSpec, kind: LayerKind) -> int:
    """Elements of one decoder layer of ``kind``: mixer, FFN and the layer's hidden-size norms."""
    norms = spec.norms_per_layer * norm_parameters(spec.norm, spec.hidden_size)
    return sum(mixer_parameters(spec, kind.mixer).values()) + sum(ffn_parameters(spec, kind.ffn).values()) + norms


def parameter_breakdown(spec: ModelSpec) -> ParameterBreakdown:
    """Count every parameter of ``spec`` by component (see :class:`ParameterBreakdown`), layer kind by
    layer kind (a model read from its code: the components its module tree was read into)."""
    if spec.generic is not None:
        return generic_breakdown(spec.generic)
    hidden = spec.hidden_size
    slots: dict[str, int] = {}
    kinds: dict[LayerKind, int] = {}
    for layer in spec.layers:
        kinds[layer.kind] = kinds.get(layer.kind, 0) + 1
    for kind, count in kinds.items():
        for counts in (mixer_parameters(spec, kind.mixer), ffn_parameters(spec, kind.ffn)):
            for slot, elements in counts.items():
                slots[slot] = slots.get(slot, 0) + count * elements
    unknown = set(slots) - set(_LAYER_SLOTS)
    if unknown:  # a counting rule naming a slot the breakdown lacks is a bug, never a dropped count
        raise RuntimeError(f"parameter slots without a ParameterBreakdown field: {sorted(unknown)}")
    lm_head = 0 if spec.tie_word_embeddings else hidden * spec.vocab_size
    if spec.lm_head_bias:
        lm_head += spec.vocab_size
    learned = spec.position.kind is PositionKind.LEARNED
    moe_layers = spec.num_moe_layers
    return ParameterBreakdown(
        embedding=spec.vocab_size * hidden,
        position_embedding=spec.position.max_positions * hidden if learned else 0,
        norms=spec.num_layers * spec.norms_per_layer * norm_parameters(spec.norm, hidden),
        final_norm=norm_parameters(spec.norm, hidden) if spec.final_norm else 0,
        lm_head=lm_head,
        extra=sum(count for _, count in spec.extra_parameters),
        vision=spec.vision.tower_parameters if spec.vision is not None else 0,
        projector=spec.vision.projector_parameters if spec.vision is not None else 0,
        persistent_buffers=moe_layers * spec.moe.num_experts if spec.moe and spec.moe.router_score_bias else 0,
        **{slot: slots.get(slot, 0) for slot in _LAYER_SLOTS},
    )


_LAYER_SLOTS = ("attention", "ssm", "linear_attention", "mlp", "moe_experts", "moe_shared", "moe_router")


def active_parameters(spec: ModelSpec) -> int:
    """Parameters a token passes through: ``total - moe_layers * (E - k) * expert``.

    Embedding, attention, shared experts and the router are always active; of
    the routed experts only ``experts_per_token`` are. Equals ``total`` for dense
    models. (Mixtral 8x7B: 12.9B of 46.7B; DeepSeek-V3: 37B of 671B.)
    """
    if spec.generic is not None:
        return spec.generic.active
    total = spec.num_parameters
    if spec.moe is None or not spec.num_moe_layers:
        return total
    idle = spec.moe.num_experts - spec.moe.experts_per_token
    return total - spec.num_moe_layers * idle * expert_parameters(spec.moe, spec.hidden_size)
