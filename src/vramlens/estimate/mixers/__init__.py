"""Saved activations of the token mixers with a per-sequence state: Mamba 1 and 2 and gated DeltaNet.

Each module models what transformers' torch fallback keeps for backward - the code that runs
when the ``mamba_ssm``, ``causal_conv1d`` and ``flash-linear-attention`` CUDA kernels are not
installed, which is also what the simulator's fake-tensor run executes. The fused kernels keep
far less (they recompute the scan in backward); an estimate says which path it models.
"""

from __future__ import annotations

__all__ = ["KERNEL_ASSUMPTION"]

#: The one-line assumption an estimate of a model with these mixers carries.
KERNEL_ASSUMPTION = (
    "Mamba / linear-attention layers: transformers' torch implementation (no mamba_ssm, causal_conv1d or "
    "flash-linear-attention kernels), whose scans keep their fp32 intermediates for backward"
)
