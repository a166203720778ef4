"""Saved activations of the token mixers with a per-sequence state: Mamba 1 and 2 and gated DeltaNet.

Each module models what transformers' torch fallback keeps for backward - the code that runs
when the ``mamba_ssm``, ``causal_conv1d`` and ``flash-linear-attention`` CUDA kernels are not
installed, which is also what the simulator's fake-tensor run executes. The fused kernels keep
far less (they recompute the scan in backward); an estimate says which path it models.
"""

from __future__ import annotations

from collections.abc import Callable

from vramlens.estimator.mixers.mamba import mamba_after_scan_parts
from vramlens.estimator.saved_parts import LayerRecipe, Part
from vramlens.model.components import MixerKind
from vramlens.model.spec import ModelSpec
from vramlens.model.ssm import MambaVersion

__all__ = ["KERNEL_ASSUMPTION", "STATE_MIXERS", "mixer_after_scan_parts", "mixer_backward_working"]

FP32 = 4
#: Mixers with a per-sequence state, whose saved tensors follow the torch fallback's scans.
STATE_MIXERS = frozenset({MixerKind.MAMBA, MixerKind.LINEAR_ATTENTION, MixerKind.ATTENTION_AND_MAMBA})

#: The one-line assumption an estimate of a model with these mixers carries.
KERNEL_ASSUMPTION = (
    "Mamba / linear-attention layers: transformers' torch implementation (no mamba_ssm, causal_conv1d or "
    "flash-linear-attention kernels), whose scans keep their fp32 intermediates for backward"
)


def _mamba_backward(spec: ModelSpec, seq: int, compute_bytes: int) -> float:
    """Mamba 1's backward through its token loop accumulates the fp32 ``d_inner x N`` gradients of
    the discretized ``A`` and of ``dt B x`` (each step's slice gradient is a full-size tensor added
    into the buffer), then multiplies them through ``exp`` and ``A dt``: four such tensors at its
    peak (simulated Jamba layers). Mamba 2's chunked backward is covered by the MLP's working set."""
    m = spec.mamba
    assert m is not None
    if m.version is MambaVersion.MAMBA1:
        return 4 * FP32 * m.intermediate_size * m.state_size
    return 0.0


#: Bytes per token a mixer's backward briefly creates beyond what it kept (its gradient working set).
_BACKWARD: dict[MixerKind, Callable[[ModelSpec, int, int], float]] = {
    MixerKind.MAMBA: _mamba_backward,
    MixerKind.ATTENTION_AND_MAMBA: _mamba_backward,
}


def mixer_backward_working(spec: ModelSpec, mixers: set[MixerKind], *, seq: int, compute_bytes: int) -> float:
    """The largest backward working set, bytes per token, of the given mixers (0 for those whose
    backward stays within the MLP's working set)."""
    return max((_BACKWARD[kind](spec, seq, compute_bytes) for kind in mixers if kind in _BACKWARD), default=0.0)


#: What a mixer with a backward working set keeps after its scan (freed before the scan's backward).
_AFTER_SCAN: dict[MixerKind, Callable[[LayerRecipe], list[Part]]] = {
    MixerKind.MAMBA: mamba_after_scan_parts,
    MixerKind.ATTENTION_AND_MAMBA: mamba_after_scan_parts,
}


def mixer_after_scan_parts(recipe: LayerRecipe, mixer: MixerKind) -> list[Part]:
    """The saved tensors (bytes per token) a mixer of kind ``mixer`` keeps after its scan, already
    freed when the scan's backward working set (:func:`mixer_backward_working`) is alive; none for
    mixers without such a working set."""
    after = _AFTER_SCAN.get(mixer)
    return after(recipe) if after is not None else []
