"""What a gated DeltaNet (Qwen3-Next ``linear_attention`` layer) keeps for backward in transformers'
torch implementation (``torch_chunk_gated_delta_rule``), bytes per token.

The delta rule runs in fp32 over chunks of ``L = 64`` tokens (the sequence padded to whole
chunks), every query/key head repeated to the ``Hv`` value heads: it keeps L2-normalized
queries and keys, their padded copies, ``k beta``, five ``L x L`` matrices per head and chunk
(pairwise decays, ``k k^T``, ``q k^T``, the UT system and the intra-chunk attention: ``4 Hv L``
bytes per token each), the triangular solves' outputs, the decayed queries and keys, each
chunk's ``v_new`` and the recurrent state entering each chunk (``Hv x dk x dv`` fp32). Around
it: the convolution's input and padded output, the gates, and the gated RMSNorm's fp32 copies.
Multiplications keep an operand only for the other's gradient: frozen layers keep less.
Source: transformers 5.x modeling_qwen3_next.py (``Qwen3NextGatedDeltaNet``,
``torch_chunk_gated_delta_rule``, ``Qwen3NextRMSNormGated``); checked against autograd's saved
tensors on CPU (tests/estimator/test_activations_hf.py).
"""

from __future__ import annotations

import math

from vramlens.estimator.saved_parts import FP32, LayerRecipe, Part, group_inputs, lora_parts
from vramlens.model.components import LayerKind

__all__ = ["deltanet_saved_parts"]


def _projections(recipe: LayerRecipe, input_bytes: int) -> list[Part]:
    """``in_proj_qkvz``/``in_proj_ba`` (one kept input), the convolution over q, k, v and the gates."""
    g, a, f, s = recipe.spec.linear_attention, recipe.compute_bytes, FP32, recipe.seq
    assert g is not None
    h, heads = recipe.spec.hidden_size, g.num_value_heads
    parts = group_inputs(recipe, "gdn_in", h, input_bytes=input_bytes, gathered=True)
    parts += lora_parts(recipe, "gdn_in", h, input_bytes=input_bytes)
    parts += [
        Part(name="q, k, v concatenated (the convolution's input)", bytes_per_token=a * g.conv_dim),
        Part(
            name="convolution output with its k-1 padding (silu input)",
            bytes_per_token=a * g.conv_dim * (s + g.conv_kernel - 1) / s,
        ),
        Part(name="beta = sigmoid(b) and the fp32 decay's softplus input", bytes_per_token=(a + f) * heads),
    ]
    if recipe.train.norms:  # A_log trains: the product keeps softplus's output
        parts.append(Part(name="softplus output (A decay)", bytes_per_token=f * heads))
    return parts


def _delta_rule(recipe: LayerRecipe) -> list[Part]:
    g, f, s = recipe.spec.linear_attention, FP32, recipe.seq
    assert g is not None
    heads, dk, dv = g.num_value_heads, g.key_head_dim, g.value_head_dim
    chunks = math.ceil(s / g.chunk_size)
    r = chunks * g.chunk_size / s  # padded positions per token
    a = recipe.compute_bytes
    # ``x.transpose(1, 2).to(float32, memory_format=contiguous)`` copies in bf16; in fp32 it returns
    # the transposed view: the L2 norms then keep q and k themselves (with as many key as value
    # heads, views of the convolution output) and the batched matmuls copy what they keep.
    views = a == f and g.num_key_heads == g.num_value_heads  # q and k: views of the convolution output
    qk = a * g.conv_dim if views else 2 * f * heads * dk
    layout_copies = 4 * f * heads * dk * r if a == f else 0.0
    return [
        Part(name="fp32 queries and keys before L2 norm, and their rsqrt", bytes_per_token=qk + 2 * f * heads),
        Part(name="fp32: matmul copies of k beta, keys (twice) and queries", bytes_per_token=layout_copies),
        Part(name="padded queries, keys, k beta and k cumdecay (fp32)", bytes_per_token=4 * f * heads * dk * r),
        Part(name="padded values, new values, v_new (fp32)", bytes_per_token=3 * f * heads * dv * r),
        Part(name="padded beta and three decay exponentials", bytes_per_token=4 * f * heads * r),
        Part(
            name="pairwise decays, k k^T, q k^T, UT system, intra-chunk attention (L x L per head)",
            bytes_per_token=5 * f * heads * g.chunk_size * r,
        ),
        # The last chunk's state update feeds no output (no cache asks for the final state) and is
        # freed; with one chunk so are the decayed queries and keys (the first chunk's output reads a
        # zero state that needs no gradient) and the chunk decays. From two chunks on, each whole
        # tensor stays (its later chunks' views are kept).
        Part(name="decayed queries and keys (fp32)", bytes_per_token=2 * f * heads * dk * r if chunks > 1 else 0.0),
        Part(
            name="recurrent states entering each chunk and the chunk decays",
            bytes_per_token=f * heads * (chunks * dk * dv + (chunks if chunks > 1 else 0)) / s,
        ),
    ]


def _gated_norm(recipe: LayerRecipe) -> list[Part]:
    """``Qwen3NextRMSNormGated`` over each value head: fp32 copies of the core output and of the
    gate, the rsqrt, silu(gate) and the weighted output; then ``out_proj``'s input."""
    g, a, f = recipe.spec.linear_attention, recipe.compute_bytes, FP32
    assert g is not None
    v = g.value_dim
    parts = [
        Part(name="gated norm: fp32 core output and gate, silu(gate)", bytes_per_token=3 * f * v),
        Part(name="gated norm rsqrt per value head and weighted output", bytes_per_token=f * g.num_value_heads + a * v),
    ]
    if recipe.train.norms:
        parts.append(Part(name="gated norm normalized (weight input)", bytes_per_token=a * v))
    parts += group_inputs(recipe, "gdn_out", v, input_bytes=a, gathered=False)
    parts += lora_parts(recipe, "gdn_out", v, input_bytes=a)
    return parts


def deltanet_saved_parts(recipe: LayerRecipe, input_bytes: int, kind: LayerKind | None = None) -> list[Part]:
    """Every tensor one gated DeltaNet keeps for backward (bytes per token); ``input_bytes``: the
    bytes per element of the normed tensor its input projections read (the layer ``kind``'s
    attention window and rotary flag do not apply)."""
    parts = _projections(recipe, input_bytes) + _delta_rule(recipe) + _gated_norm(recipe)
    return [part for part in parts if part.bytes_per_token]
