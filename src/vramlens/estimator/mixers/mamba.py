"""What a Mamba mixer keeps for backward in transformers' torch implementation (bytes per token).

Mamba 2 (Falcon-H1, Nemotron-H, Granite 4.0-H: ``mamba2_chunk_scan``) pads the sequence to whole
chunks of ``L`` and keeps, in fp32, the chunk-local ``L x L`` decay and score matrices per head
(``4 H L`` bytes per token each), copies of x, B and C laid out for its einsums, and per chunk the
``H x P x N`` states; the gated RMSNorm keeps fp32 copies of the gate and the scan output.
Mamba 1 (Jamba: ``mamba_selective_scan``) loops over the tokens and keeps the fp32
discretized ``A`` and ``B x`` (``d_inner x N`` per token each) and every step's state, in fp32
and as the bf16 copy the output matmul reads: about ``(8 + 4 + c) d_inner N`` bytes per token.

Both keep the convolution's input (a view of the whole ``in_proj`` output) and its padded output.
Multiplications keep an operand only for the other operand's gradient, so frozen mixers (LoRA)
keep less (the ``trained`` terms). Units: bytes per token of one layer; ``recipe.seq`` tokens per
sequence. Source: transformers 5.x modeling_falcon_h1.py / modeling_nemotron_h.py /
modeling_granitemoehybrid.py (``mamba2_chunk_scan``, ``*RMSNormGated``) and modeling_jamba.py
(``mamba_selective_scan``); checked against autograd's saved tensors on CPU
(tests/estimator/test_activations_hf.py).
"""

from __future__ import annotations

import math

from vramlens.estimator.saved_parts import FP32, LayerRecipe, Part, group_inputs, lora_parts, norm_saved
from vramlens.model.components import LayerKind
from vramlens.model.ssm import MambaSpec, MambaVersion

__all__ = ["mamba_after_scan_parts", "mamba_saved_parts"]


def _mixer(recipe: LayerRecipe) -> MambaSpec:
    mamba = recipe.spec.mamba
    assert mamba is not None  # ModelSpec checks that Mamba layers have a Mamba mixer
    return mamba


def _convolution(recipe: LayerRecipe, input_bytes: int) -> list[Part]:
    """``in_proj`` (its kept input), and the depthwise convolution: its input is a view of the
    whole ``in_proj`` output, its output (with ``k - 1`` padded positions) is the silu's input."""
    m, a, h, s = _mixer(recipe), recipe.compute_bytes, recipe.spec.hidden_size, recipe.seq
    parts = group_inputs(recipe, "ssm_in", h, input_bytes=input_bytes, gathered=True)
    parts += lora_parts(recipe, "ssm_in", h, input_bytes=input_bytes)
    parts.append(
        Part(name="in_proj output (the convolution's input is a view of it)", bytes_per_token=a * m.in_proj_size)
    )
    padded = m.conv_dim * (s + m.conv_kernel - 1) / s
    parts.append(Part(name="convolution output with its k-1 padding (silu input)", bytes_per_token=a * padded))
    return parts


def _out_proj(recipe: LayerRecipe) -> list[Part]:
    d, a = _mixer(recipe).intermediate_size, recipe.compute_bytes
    return group_inputs(recipe, "ssm_out", d, input_bytes=a, gathered=False) + lora_parts(
        recipe, "ssm_out", d, input_bytes=a
    )


def _chunk_scan(recipe: LayerRecipe) -> list[Part]:
    """``mamba2_chunk_scan`` in fp32 over ``c`` chunks of ``L`` (the sequence padded to ``c L``)."""
    m, s = _mixer(recipe), recipe.seq
    f, heads, n, d, p = FP32, m.num_heads, m.state_size, m.intermediate_size, m.head_dim
    chunks = math.ceil(s / m.chunk_size)
    r = chunks * m.chunk_size / s  # padded positions per token
    square = f * heads * m.chunk_size * r  # one [L x L] fp32 matrix per head and chunk
    return [
        Part(name="intra-chunk decay exp(segsum(A dt)) and C B^T", bytes_per_token=2 * square),
        Part(name="their product laid out for the diagonal output", bytes_per_token=square),
        Part(name="C and B laid out for C B^T, B for the chunk states", bytes_per_token=3 * f * heads * n * r),
        Part(
            name="decayed B and C laid out for the chunk states and state outputs",
            bytes_per_token=2 * f * heads * n * r,
        ),
        Part(name="x laid out for the diagonal output and the chunk states", bytes_per_token=2 * f * d * r),
        Part(name="decays to the chunk end and from the chunk start", bytes_per_token=2 * f * heads * r),
        Part(name="inter-chunk state output C states", bytes_per_token=f * d * r),
        Part(
            name="chunk states (inter-chunk recurrence and state outputs) and chunk-to-chunk decay",
            bytes_per_token=f * heads * ((2 * chunks + 1) * p * n + (chunks + 1) ** 2) / s,
        ),
    ]


def _mamba2_inputs(recipe: LayerRecipe) -> list[Part]:
    """Time step (softplus, clamp, fp32 copies) and the fp32 x the scan multiplies by dt."""
    m, a, f = _mixer(recipe), recipe.compute_bytes, FP32
    trained = recipe.train.norms  # the mixer's own A, D, dt bias, conv and norm train (full fine-tuning)
    r = math.ceil(recipe.seq / m.chunk_size) * m.chunk_size / recipe.seq
    # In bf16 ``x.float()`` is a copy of x; in fp32 it is the silu output itself (x, B and C).
    x32 = f * m.intermediate_size if a != f else f * m.conv_dim
    parts = [
        Part(
            name="time step: softplus and clamp inputs, fp32 time step",
            bytes_per_token=2 * a * m.num_heads + f * m.num_heads,
        ),
        Part(name="x in fp32 (x dt)", bytes_per_token=x32),
    ]
    if trained:
        parts.append(Part(name="padded fp32 x (D skip)", bytes_per_token=f * m.intermediate_size * r))
        if a != f:  # a second ``dt.float()``; in fp32 both are the clamped time step itself
            parts.append(Part(name="fp32 time step copy (A dt)", bytes_per_token=f * m.num_heads))
    return parts


def _gated_norm(recipe: LayerRecipe) -> list[Part]:
    """The gate: ``*RMSNormGated`` (gate first: Nemotron-H, Granite; norm first: Falcon-H1) or,
    without a norm (Falcon-H1 ``mamba_rms_norm: false``), ``scan * silu(gate)``."""
    m, a, f, d = _mixer(recipe), recipe.compute_bytes, FP32, _mixer(recipe).intermediate_size
    # The scan output is a slice of the padded chunk output: its storage holds the padding too.
    scan = f * d * math.ceil(recipe.seq / m.chunk_size) * m.chunk_size / recipe.seq
    if not m.gated_norm:
        return [Part(name="fp32 scan output (padded) and silu(gate)", bytes_per_token=scan + a * d)]
    # Gate first: fp32 scan output, silu(gate) and their product; norm first: the scan output,
    # the weighted norm output and silu(gate). The gate's fp32 copy is the gate itself in fp32.
    parts = [
        Part(name="gated norm: fp32 scan output (padded)", bytes_per_token=scan),
        Part(name="gated norm: silu(gate) and the gated or weighted product", bytes_per_token=2 * f * d),
        Part(name="gated norm rsqrt per group", bytes_per_token=f * m.n_groups),
    ]
    if a != f:
        parts.append(Part(name="gated norm: fp32 copy of the gate (silu input)", bytes_per_token=f * d))
    if recipe.train.norms:
        parts.append(Part(name="gated norm normalized (weight input)", bytes_per_token=f * d))
    return parts


def _mamba2(recipe: LayerRecipe, input_bytes: int) -> list[Part]:
    return (
        _convolution(recipe, input_bytes)
        + _mamba2_inputs(recipe)
        + _chunk_scan(recipe)
        + _gated_norm(recipe)
        + _out_proj(recipe)
    )


def _selective_projections(recipe: LayerRecipe) -> list[Part]:
    """Mamba 1's ``x_proj`` (a contiguous copy of the transposed convolution output), the RMSNorms
    on dt, B and C, and ``dt_proj.weight @ dt`` (keeps dt when the weight trains)."""
    m, a = _mixer(recipe), recipe.compute_bytes
    d, n, rank = m.intermediate_size, m.state_size, m.time_step_rank
    parts = group_inputs(recipe, "ssm_x", d, input_bytes=a, gathered=False)
    parts += lora_parts(recipe, "ssm_x", d, input_bytes=a)
    if m.inner_norms:
        for width, name in ((rank, "dt norm"), (n, "B norm"), (n, "C norm")):
            parts += norm_saved(recipe, width, input_bytes=a, name=name)
    if recipe.train.norms:
        parts.append(Part(name="time-step projection input", bytes_per_token=a * rank))
    return parts


def _selective_scan(recipe: LayerRecipe) -> list[Part]:
    """``mamba_selective_scan``'s sequential loop: per token the fp32 ``exp(A dt)`` and ``dt B x``
    (``d_inner x N`` each), and every step's state: fp32 (kept by the next step) and in the
    compute dtype (kept by the output matmul; the same tensor in fp32)."""
    m, a, f, s = _mixer(recipe), recipe.compute_bytes, FP32, recipe.seq
    d, n = m.intermediate_size, m.state_size
    # fp32: the zero initial state and every step's state; else s - 1 fp32 states kept by the next
    # step, the zero state in the compute dtype and every state's copy the output matmul reads.
    states = f * d * n * (1 + 1 / s) if a == f else f * d * n * (s - 1) / s + a * d * n / s + a * d * n
    return [
        Part(name="time step before and after softplus", bytes_per_token=2 * a * d),
        Part(name="discretized A = exp(A dt) and dt B (fp32)", bytes_per_token=2 * f * d * n),
        Part(name="B and x in fp32", bytes_per_token=f * (n + d)),
        Part(name="scan states of every step", bytes_per_token=states),
        Part(name="C (each step's output matmul)", bytes_per_token=a * n),
    ]


def _selective_output(recipe: LayerRecipe) -> list[Part]:
    """After the token loop: the ``D`` skip (keeps the convolution output when ``D`` trains, unless
    that is the fp32 ``x`` already counted) and the gate (the fp32 scan output and ``silu(gate)``)."""
    m, a, f = _mixer(recipe), recipe.compute_bytes, FP32
    d = m.intermediate_size
    return [
        Part(name="convolution output (D skip)", bytes_per_token=a * d if (recipe.train.norms and a != f) else 0),
        Part(name="fp32 scan output and silu(gate)", bytes_per_token=f * d + a * d),
    ]


def _mamba1(recipe: LayerRecipe, input_bytes: int) -> list[Part]:
    return (
        _convolution(recipe, input_bytes)
        + _selective_projections(recipe)
        + _selective_scan(recipe)
        + _selective_output(recipe)
        + _out_proj(recipe)
    )


_BY_VERSION = {MambaVersion.MAMBA1: _mamba1, MambaVersion.MAMBA2: _mamba2}

#: What each version keeps after its scan (the gate, the output projection's input).
_AFTER_SCAN = {
    MambaVersion.MAMBA1: lambda recipe: _selective_output(recipe) + _out_proj(recipe),
    MambaVersion.MAMBA2: lambda recipe: _gated_norm(recipe) + _out_proj(recipe),
}


def mamba_saved_parts(recipe: LayerRecipe, input_bytes: int, kind: LayerKind | None = None) -> list[Part]:
    """Every tensor one Mamba mixer keeps for backward (bytes per token), ``input_bytes`` being the
    bytes per element of the normed tensor ``in_proj`` reads. The layer ``kind``'s attention
    window and rotary flag do not apply."""
    parts = _BY_VERSION[_mixer(recipe).version](recipe, input_bytes)
    return [part for part in parts if part.bytes_per_token]


def mamba_after_scan_parts(recipe: LayerRecipe) -> list[Part]:
    """The part of :func:`mamba_saved_parts` that the mixer keeps after its scan (the gate and the
    output projection's input, bytes per token): their backward runs first, so they are freed
    before the scan's own backward begins (seen in the simulated Jamba step, where the scan's
    gradient buffers peak after ``out_proj`` and the gate released their inputs)."""
    return [part for part in _AFTER_SCAN[_mixer(recipe).version](recipe) if part.bytes_per_token]
