"""Working memory of a Mamba or gated-DeltaNet mixer in one inference forward (no gradients).

transformers' torch implementations keep every intermediate of the scan in a local variable until
the function returns, so the peak is most of what the scan computes (Units: bytes; ``tokens`` =
batch x new tokens per sequence, ``c`` the compute dtype's bytes, fp32 = 4):

* Mamba 1 prefill (``mamba_selective_scan``): the discretized ``exp(A dt)``, ``dt B`` and ``dt B x``,
  each fp32 ``d_inner x N`` per token, beside fp32 x, the steps' outputs and the D skip; around the scan the ``in_proj`` output
  (x and gate), the convolution's silu output, dt and its softplus.
* Mamba 2 prefill (``mamba2_chunk_scan``, sequence padded to whole chunks of ``L``): the fp32
  x dt, D skip, diagonal and state outputs and their sum (about seven ``d_inner`` tensors), B, C and
  decayed B laid out per head (three ``heads x N``), the ``L x L`` decay, score and masked-score
  matrices per head (three ``heads x L``) and the chunk states; around it the ``in_proj`` output
  (the gate reads it after the scan) and the convolution's silu output.
* gated DeltaNet prefill (``torch_chunk_gated_delta_rule``, chunks of 64): fp32 queries, keys,
  values, ``k beta``, ``v beta``, decayed ``k beta``, the triangular solves' outputs and the output
  buffer (five key-width and four value-width tensors per value head) beside three ``L x L``
  matrices per head, or, while ``q k^T`` is masked, four such matrices beside fewer vectors; around it the ``in_proj_qkvz`` output, the convolution's silu output and
  the gate.
* decode (one token per sequence, the recurrent kernels): a few fp32 copies of each sequence's
  state (``exp(A dt)``, ``dt B x`` and the new state; the delta rule's decayed state, its
  product with the key and the updated state): three states per sequence.

Checked against the simulator's prefill of the tiny hybrid configs (tests/simulator/test_agreement.py).
Source: transformers 5.x modeling_jamba.py, modeling_nemotron_h.py / modeling_falcon_h1.py /
modeling_granitemoehybrid.py, modeling_qwen3_next.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from vramlens.model.components import MixerKind
from vramlens.model.spec import ModelSpec
from vramlens.model.ssm import MambaVersion

__all__ = ["hf_mixer_working_bytes"]

FP32 = 4


def _padding(seq: int, chunk: int) -> float:
    """Padded positions per token when ``seq`` tokens are padded to whole chunks."""
    return math.ceil(seq / chunk) * chunk / seq


def _mamba(spec: ModelSpec, batch: int, seq: int, c: int) -> float:
    m = spec.mamba
    assert m is not None
    d, n, f = m.intermediate_size, m.state_size, FP32
    if seq == 1:  # selective_state_update on each sequence's state
        return batch * 3 * f * m.recurrent_state_elements + batch * c * m.in_proj_size
    tokens = batch * seq
    around = c * (m.in_proj_size + m.conv_dim)  # the in_proj output (the gate reads it last) and the silu output
    if m.version is MambaVersion.MAMBA1:
        # exp(A dt), dt B, dt B x; fp32 x; dt and its softplus; at the end the per-step outputs, their
        # stack and the fp32 D skip and sum.
        return tokens * (around + 3 * f * d * n + 3 * f * d + 4 * c * d)
    r = _padding(seq, m.chunk_size)
    heads = m.num_heads
    scan = f * r * (7 * d + 3 * heads * n + 3 * heads * m.chunk_size)
    chunks = math.ceil(seq / m.chunk_size)
    states = f * heads * m.head_dim * n * 2 * (chunks + 1) / seq  # the chunk states and an einsum's copy
    return tokens * (around + scan + states)


def _deltanet(spec: ModelSpec, batch: int, seq: int, c: int) -> float:
    g = spec.linear_attention
    assert g is not None
    f, heads = FP32, g.num_value_heads
    if seq == 1:  # torch_recurrent_gated_delta_rule on each sequence's state
        return batch * 3 * f * g.recurrent_state_elements + batch * c * (2 * g.conv_dim + 2 * g.value_dim)
    r = _padding(seq, g.chunk_size)
    dk, dv, square = g.key_head_dim, g.value_head_dim, g.chunk_size
    # While q k^T is masked: four L x L matrices beside q, k, k beta, v and v beta; in the chunk loop:
    # three beside nine key- or value-width tensors.
    scan = f * r * heads * max(3 * dk + 2 * dv + 4 * square, 5 * dk + 4 * dv + 3 * square)
    around = c * (2 * g.key_dim + 2 * g.value_dim + g.conv_dim + g.value_dim)  # qkvz, silu(conv(qkv)), z
    return batch * seq * (around + scan)


_WORKING: dict[MixerKind, Callable[[ModelSpec, int, int, int], float]] = {
    MixerKind.MAMBA: _mamba,
    MixerKind.ATTENTION_AND_MAMBA: _mamba,
    MixerKind.LINEAR_ATTENTION: _deltanet,
}


def hf_mixer_working_bytes(spec: ModelSpec, mixer: MixerKind, *, batch: int, seq_q: int, compute_bytes: int) -> int:
    """Peak working bytes of one ``mixer`` (Mamba / gated DeltaNet) forward over ``batch x seq_q``
    new tokens; 0 for mixers without a per-sequence state (attention is counted elsewhere)."""
    working = _WORKING.get(mixer)
    return 0 if working is None else int(working(spec, batch, seq_q, compute_bytes))
