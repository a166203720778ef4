"""Activation memory: the tensors a forward pass keeps for the backward pass.

Counted per token of one decoder layer, as the list of tensors autograd saves,
following the eager implementation (see :mod:`vramlens.resolve.styles`):

* a linear layer keeps its input only if its weight, or a LoRA adapter on it, is
  trained; under autocast each such linear keeps its own bf16 cast of an fp32 input;
* a norm keeps an fp32 copy of its input, one fp32 statistic per token, and the
  normalized tensor when its weight is trained;
* attention with an O(s) kernel (flash, memory-efficient, SDPA) keeps q, k, v, the
  output and a fp32 log-sum-exp per head; eager attention also keeps the s^2
  probabilities (fp32 and bf16), and GQA keys/values repeated to all heads;
* a gated MLP keeps gate, activation and up outputs, and the product when the
  down projection trains; activation functions keep what :mod:`vramlens.estimator.act_fns` says;
* dropout with p > 0 keeps a 1-byte mask per element.

Units: bytes per token (float, because tensor parallelism splits some parts);
the caller multiplies by tokens. Sources: transformers 5.x modeling code; the
per-family numbers are checked against autograd's saved tensors on CPU in
``tests/estimator/test_activations_hf.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vramlens.errors import InputError
from vramlens.estimator.mixers.deltanet import deltanet_saved_parts
from vramlens.estimator.mixers.mamba import mamba_saved_parts
from vramlens.estimator.moe_parts import moe_parts
from vramlens.estimator.saved_parts import (
    FP32,
    GATHERED,
    MASK,
    MLP_INPUT,
    SEQUENCE,
    STAT,
    LayerRecipe,
    Part,
    TrainState,
    gated_saved,
    group_inputs,
    lora_parts,
    norm_saved,
    plain_saved,
)
from vramlens.model.spec import FfnKind, LayerKind, MixerKind, MlpKind, ModelSpec, QKNorm
from vramlens.resolve.styles import NormStyle
from vramlens.workload.options import AttentionImpl

__all__ = [
    "LayerRecipe",
    "Part",
    "TrainState",
    "ffn_saved_parts",
    "layer_saved_parts",
    "norm_saved",
    "register_mixer_saved",
]


def _qk_norm_parts(recipe: LayerRecipe, q: int, kv: int, *, rope: bool) -> list[Part]:
    attention = recipe.spec.attn
    if attention.qk_norm is QKNorm.NONE or (attention.qk_norm is QKNorm.L2 and not rope):
        return []
    if attention.qk_norm is QKNorm.L2:
        # Llama 4's parameter-free L2 norm of each head on rotary layers: an fp32 copy and one rsqrt per head.
        return [
            Part(name="q L2 norm fp32 input and rsqrt", bytes_per_token=FP32 * q + STAT * attention.num_heads),
            Part(name="k L2 norm fp32 input and rsqrt", bytes_per_token=FP32 * kv + STAT * attention.num_kv_heads),
        ]
    stats = (attention.num_heads, attention.num_kv_heads) if attention.qk_norm is QKNorm.PER_HEAD else (1, 1)
    parts = []
    if recipe.style.norm == NormStyle.LAYERNORM:
        # nn.LayerNorm (Phi-2 qk_layernorm): its input and mean + rstd per normalized row.
        for label, width, count in (("q_norm", q, stats[0]), ("k_norm", kv, stats[1])):
            parts.append(Part(name=f"{label} input", bytes_per_token=recipe.compute_bytes * width))
            parts.append(Part(name=f"{label} mean+rstd", bytes_per_token=2 * STAT * count))
        return parts
    keep = (recipe.compute_bytes if recipe.style.norm == NormStyle.RMS else FP32) if recipe.train.norms else 0
    # In fp32 the norm's up-cast is a no-op: it keeps its input, and a query that is a view of a
    # q_proj output also holding the output gates (Qwen3-Next) keeps that whole output.
    q_storage = 2 * q if (attention.output_gate and recipe.compute_bytes == FP32) else q
    for label, width, count, stored in (("q_norm", q, stats[0], q_storage), ("k_norm", kv, stats[1], kv)):
        parts.append(Part(name=f"{label} fp32 input", bytes_per_token=FP32 * stored))
        parts.append(Part(name=f"{label} rsqrt", bytes_per_token=STAT * count))
        if keep:
            parts.append(Part(name=f"{label} normalized", bytes_per_token=keep * width))
    return parts


@dataclass(frozen=True, slots=True)
class _Widths:
    """Per-token widths of the attention tensors (heads x head size)."""

    q: int
    k: int
    v: int
    """Also the width of the attention output."""


def _widths(spec: ModelSpec) -> _Widths:
    attention = spec.attn
    mla = attention.mla
    if mla is not None:
        qk = attention.num_heads * mla.qk_head_dim
        return _Widths(q=qk, k=qk, v=attention.num_heads * mla.v_head_dim)
    return _Widths(
        q=attention.num_heads * attention.head_dim,
        k=attention.num_kv_heads * attention.head_dim,
        v=attention.num_kv_heads * attention.head_dim,
    )


def _attention_core(recipe: LayerRecipe, widths: _Widths, *, sliding: bool) -> list[Part]:
    """What the attention kernel keeps for backward.

    With an attention mask (sliding-window layers under SDPA) transformers repeats
    GQA keys/values to every head instead of using SDPA's native GQA; torchtune always
    does (:attr:`HfStyle.kv_repeat`). Flash attention
    (transformers' flash_attention_2) applies windows and GQA itself: no mask, no repeat.
    """
    spec, a = recipe.spec, recipe.compute_bytes
    heads = spec.num_heads
    out = widths.q if spec.attn.mla is None else widths.v
    masked = (sliding or recipe.style.sdpa_mask) and recipe.attention is not AttentionImpl.FLASH
    if not recipe.eager_like(sliding=sliding):
        expanded = masked or recipe.style.kv_repeat
        # One KV head: ``repeat_kv``'s reshape of the expanded keys merges a size-1 dimension with the stride-0
        # one, a view (no copy); litgpt's ``repeat_interleave`` copies it (:attr:`HfStyle.kv_repeat_interleave`).
        copied = expanded and spec.attn.mla is None and (spec.num_kv_heads > 1 or recipe.style.kv_repeat_interleave)
        repeat = heads // spec.num_kv_heads if copied else 1
        parts = [
            Part(name="attention q", bytes_per_token=a * widths.q),
            Part(name="attention k, v", bytes_per_token=a * (widths.k + widths.v) * repeat),
            Part(name="attention output", bytes_per_token=a * out),
            Part(name="attention log-sum-exp", bytes_per_token=FP32 * heads),
        ]
        if recipe.style.qkv_views and repeat == 1 and recipe.linear_out_bytes in (0, a):
            # The kept value is a view of the fused qkv output; queries and keys were replaced by rotary copies.
            # (An fp32 output of a 4-bit linear reaches the kernel as a bf16 autocast cast: no view kept.)
            parts.append(Part(name="fused qkv output behind the value view", bytes_per_token=a * (widths.q + widths.k)))
        if masked:
            # SDPA turns the boolean mask into an additive bias in the query dtype on every
            # call, and the memory-efficient kernel keeps it for backward: [b, 1, s, s].
            parts.append(Part(name="attention mask as a bias", bytes_per_token=a * recipe.seq, split=GATHERED))
        return parts
    repeat = heads // spec.num_kv_heads if spec.attn.mla is None else 1
    scores = heads * recipe.seq
    # .to(fp32) is a no-op on fp32 scores. gpt-oss softmaxes in its scores' dtype, which under autocast
    # the fp32 mask and sinks make fp32; the probabilities are then cast to the values' dtype (a copy).
    sinks_fp32 = spec.attn.sinks and recipe.autocast
    upcast = (recipe.style.eager_softmax_fp32 or sinks_fp32) and a != FP32
    parts = [
        Part(name="attention q", bytes_per_token=a * widths.q),
        Part(name="attention k, v (repeated to all heads)", bytes_per_token=a * (widths.k + widths.v) * repeat),
        Part(
            name="attention probabilities",
            bytes_per_token=(FP32 + a if upcast else a) * scores,
        ),
    ]
    if spec.attn.sinks:
        # gpt-oss: the softmax runs over each row's scores and its head's sink logit (s + 1 columns),
        # after subtracting the row maximum, whose int64 index max() keeps for backward.
        softmax_bytes = FP32 if upcast else a
        parts.append(
            Part(name="attention sink column and row-max indices", bytes_per_token=(softmax_bytes + 8) * heads)
        )
    if spec.attn.logit_softcap:
        parts.append(Part(name="attention soft-cap tanh", bytes_per_token=a * scores))
    if spec.attn.dropout > 0:
        parts.append(Part(name="attention dropout mask + output", bytes_per_token=(MASK + a) * scores))
    return parts


def _mla_latent_parts(recipe: LayerRecipe) -> list[Part]:
    """DeepSeek MLA: the q and kv latents are normalized and read by q_b_proj / kv_b_proj."""
    mla = recipe.spec.attn.mla
    assert mla is not None
    parts: list[Part] = []
    for width, group in ((mla.q_lora_rank, "mla_q"), (mla.kv_lora_rank, "mla_kv")):
        if width:
            parts += norm_saved(recipe, width, input_bytes=recipe.compute_bytes, name=f"{group} latent norm")
            parts += group_inputs(recipe, group, width, input_bytes=recipe.compute_bytes, gathered=True)
    return parts


def _output_gate_parts(recipe: LayerRecipe, width: int, *, copy: bool, needs_out: bool) -> list[Part]:
    """Qwen3-Next's ``o_proj(attn * sigmoid(gate))``: the product keeps the attention output (a
    copy where the kernel's layout is not the heads-last one, as for ``out_proj_copy``) and the
    sigmoid's output, which the sigmoid keeps too; ``o_proj`` keeps the product when it trains."""
    a = recipe.compute_bytes
    parts = [Part(name="attention output gate sigmoid(gate)", bytes_per_token=a * width)]
    if copy:
        parts.append(Part(name="attention output copy (gate multiply input)", bytes_per_token=a * width))
    if needs_out:
        parts.append(Part(name="o_proj input (gated attention output)", bytes_per_token=a * width))
    return parts


def _attention_parts(recipe: LayerRecipe, input_bytes: int, *, sliding: bool, rope: bool) -> list[Part]:
    spec = recipe.spec
    h = spec.hidden_size
    widths = _widths(spec)
    parts = group_inputs(recipe, "attn_in", h, input_bytes=input_bytes, gathered=True)
    parts += lora_parts(recipe, "attn_in", h, input_bytes=input_bytes)
    if spec.attn.mla is not None:
        parts += _mla_latent_parts(recipe)
    parts += _qk_norm_parts(recipe, widths.q, widths.k, rope=rope)
    if spec.attn.clip_qkv:
        # OLMoE clamp_()s q, k and v in place; autograd keeps each one's value from before the clamp
        # (a clone). Under autocast the q/k norms multiply their bf16 output by fp32 weights: fp32.
        qk = FP32 if recipe.autocast and spec.attn.qk_norm is not QKNorm.NONE else recipe.compute_bytes
        clip = qk * (widths.q + widths.k) + recipe.compute_bytes * widths.v
        parts.append(Part(name="q, k, v copies kept by the in-place clip_qkv", bytes_per_token=clip))
    parts += _attention_core(recipe, widths, sliding=sliding)
    out_width = widths.q if spec.attn.mla is None else widths.v
    copy = recipe.eager_like(sliding=sliding) or recipe.style.out_proj_copy
    needs_out = any(s.group == "attn_out" and s.name in recipe.train.needs_input for s in recipe.linears)
    if spec.attn.output_gate:
        parts += _output_gate_parts(recipe, out_width, copy=copy, needs_out=needs_out)
    elif copy and needs_out:
        parts.append(
            Part(name="o_proj input (attention output copy)", bytes_per_token=recipe.compute_bytes * out_width)
        )
    parts += lora_parts(recipe, "attn_out", out_width, input_bytes=recipe.compute_bytes)
    return parts


def _mlp_parts(recipe: LayerRecipe, input_bytes: int) -> list[Part]:
    spec = recipe.spec
    mlp = spec.mlp
    assert mlp is not None
    a, i, h = recipe.compute_bytes, mlp.intermediate_size, spec.hidden_size
    out = recipe.linear_out_bytes or a  # the gate/up projections' outputs
    parts = group_inputs(recipe, "mlp_in", h, input_bytes=input_bytes, gathered=True)
    parts += lora_parts(recipe, "mlp_in", h, input_bytes=input_bytes)
    gated = mlp.kind is MlpKind.GATED
    down_keeps = any(s.group == "mlp_out" and s.name in recipe.train.needs_input for s in recipe.linears)
    if gated and recipe.fused_pointwise:
        # The activation is recomputed from the kept gate output; the product stays as the down input.
        parts.append(Part(name="mlp gate and up outputs (activation recomputed)", bytes_per_token=2 * out * i))
    elif gated:
        kept = gated_saved(mlp.activation)
        parts.append(Part(name="mlp gate, up and activation outputs", bytes_per_token=kept * out * i))
    else:
        # The down projection's kept input is the activation's output: counted here, once (an
        # fp32 output, from 4-bit linears after k-bit preparation, is kept as its bf16 cast).
        kept = plain_saved(mlp.activation, down_keeps_input=down_keeps and out == a)
        parts.append(Part(name="mlp up output, activation and its output", bytes_per_token=kept * out * i))
    if down_keeps and (gated or out != a):
        # The product, or under autocast the down projection's bf16 cast of an fp32 input.
        parts.append(Part(name="mlp down input", bytes_per_token=a * i))
    parts += lora_parts(recipe, "mlp_out", i, input_bytes=out)
    return parts


#: What one layer's token mixer keeps for backward: ``(recipe, input_bytes, kind) -> parts``,
#: ``input_bytes`` being the bytes per element of the (normed) tensor the mixer reads and ``kind``
#: the layer's kind (its attention's mask and rotary flags).
MixerSaved = Callable[[LayerRecipe, int, LayerKind], list[Part]]


def _attention_mixer(recipe: LayerRecipe, input_bytes: int, kind: LayerKind) -> list[Part]:
    return _attention_parts(recipe, input_bytes, sliding=kind.sliding, rope=kind.rope)


def _attention_and_mamba(recipe: LayerRecipe, input_bytes: int, kind: LayerKind) -> list[Part]:
    """Falcon-H1: attention and Mamba read the normed input, each through its own muP-scaled copy
    (``x * attention_in_multiplier``, ``x * ssm_in_multiplier``), which each keeps."""
    return _attention_mixer(recipe, input_bytes, kind) + mamba_saved_parts(recipe, input_bytes, kind)


_MIXER_SAVED: dict[MixerKind, MixerSaved] = {
    MixerKind.ATTENTION: _attention_mixer,
    MixerKind.MAMBA: mamba_saved_parts,
    MixerKind.LINEAR_ATTENTION: deltanet_saved_parts,
    MixerKind.ATTENTION_AND_MAMBA: _attention_and_mamba,
}


def register_mixer_saved(kind: MixerKind, saved: MixerSaved) -> None:
    """Register what a token mixer keeps for backward (a new mixer is an entry, not an ``elif``)."""
    _MIXER_SAVED[kind] = saved


def _kind(kind: LayerKind | None, *, moe_layer: bool, sliding: bool, rope: bool) -> LayerKind:
    """``kind``, or an attention layer described by the keyword flags (dense or MoE, masked, rotary)."""
    if kind is not None:
        return kind
    return LayerKind(ffn=FfnKind.MOE if moe_layer else FfnKind.DENSE, sliding=sliding, rope=rope)


def layer_saved_parts(
    recipe: LayerRecipe,
    kind: LayerKind | None = None,
    *,
    moe_layer: bool = False,
    sliding: bool = False,
    rope: bool = True,
) -> list[Part]:
    """Every tensor one decoder layer of ``kind`` keeps for backward, in bytes per token (see
    :meth:`vramlens.model.components.LayerSpec.kind_at`; without a kind: an attention layer, MoE
    when ``moe_layer``, masked by a window or chunk when ``sliding``, NoPE when not ``rope``)."""
    mixer, ffn = _layer_halves(recipe, _kind(kind, moe_layer=moe_layer, sliding=sliding, rope=rope))
    return mixer + ffn


def ffn_saved_parts(
    recipe: LayerRecipe,
    kind: LayerKind | None = None,
    *,
    moe_layer: bool = False,
    sliding: bool = False,
    rope: bool = True,
) -> list[Part]:
    """What a layer keeps from its feed-forward half (the pre-MLP norm on): not yet alive while its
    mixer runs in the forward pass, and freed before its mixer's backward runs."""
    return _layer_halves(recipe, _kind(kind, moe_layer=moe_layer, sliding=sliding, rope=rope))[1]


def _layer_halves(recipe: LayerRecipe, kind: LayerKind) -> tuple[list[Part], list[Part]]:
    """(token-mixing half, feed-forward half) of :func:`layer_saved_parts`; either may be empty."""
    residual = FP32 if recipe.autocast else recipe.compute_bytes
    # Under autocast the residual stream is fp32 and every RMSNorm returns fp32: Llama's
    # multiplies its cast-back output by the fp32 weight, Gemma's returns ``output.type_as(x)``.
    norm_out = FP32 if recipe.autocast else recipe.compute_bytes
    if recipe.style.norm == NormStyle.LAYERNORM:
        norm_out = recipe.compute_bytes if not recipe.autocast else FP32
    mixer, mixer_input = _mixer_half(recipe, kind, residual, norm_out)
    ffn = _ffn_half(recipe, kind, residual, norm_out, mixer_input)
    if recipe.spec.hidden_dropout > 0:
        h = recipe.spec.hidden_size
        ffn.append(Part(name="residual dropout masks", bytes_per_token=2 * MASK * h, split=SEQUENCE))
    return mixer, ffn


def _mixer_half(recipe: LayerRecipe, kind: LayerKind, residual: int, norm_out: int) -> tuple[list[Part], int]:
    """The token-mixing half of a layer (pre-norm, mixer, post-norm) and the bytes of the tensor
    it read (what a parallel MLP reads too). A layer without a mixer has no such half."""
    if kind.mixer is MixerKind.NONE:
        return [], residual
    saved = _MIXER_SAVED.get(kind.mixer)
    if saved is None:
        raise InputError(
            f"model: {recipe.spec.name} has {kind.mixer.value} layers, whose saved activations vramlens does not model"
        )
    parts: list[Part] = []
    h = recipe.spec.hidden_size
    if recipe.style.pre_attn_norm:
        parts += norm_saved(recipe, h, input_bytes=residual, name="input norm")
        mixer_input = norm_out
    else:
        mixer_input = residual
    parts += saved(recipe, mixer_input, kind)
    if recipe.style.post_attn_norm:
        parts += norm_saved(recipe, h, input_bytes=recipe.compute_bytes, name="post-attention norm")
    return parts, mixer_input


def _ffn_half(recipe: LayerRecipe, kind: LayerKind, residual: int, norm_out: int, attn_input: int) -> list[Part]:
    """The feed-forward half of a layer (pre-norm, MLP or MoE, post-norm); none without an FFN."""
    if kind.ffn is FfnKind.NONE:
        return []
    spec, style = recipe.spec, recipe.style
    h = spec.hidden_size
    parts: list[Part] = []
    shared_input = False
    if spec.parallel_residual:
        mlp_input = attn_input
        # With one norm, attention and MLP read one normalized tensor (under autocast each linear
        # keeps its own cast); GPT-NeoX and new Falcon normalize twice.
        shared_input = (
            spec.norms_per_layer == 1 and not (recipe.autocast and attn_input != recipe.compute_bytes)
        ) and any(s.group == "attn_in" and s.name in recipe.train.needs_input for s in recipe.linears)
        if style.norm == NormStyle.LAYERNORM and spec.norms_per_layer == 2:
            parts.append(Part(name="second parallel norm mean+rstd", bytes_per_token=2 * STAT, split=SEQUENCE))
    elif style.pre_mlp_norm:
        parts += norm_saved(recipe, h, input_bytes=residual, name="pre-MLP norm")
        mlp_input = norm_out
    else:
        mlp_input = residual
    ffn = moe_parts(recipe, mlp_input) if kind.ffn is FfnKind.MOE else _mlp_parts(recipe, mlp_input)
    parts += [p for p in ffn if not (shared_input and p.name == MLP_INPUT)]
    if style.post_mlp_norm:
        parts += norm_saved(recipe, h, input_bytes=recipe.compute_bytes, name="post-MLP norm")
    return parts
