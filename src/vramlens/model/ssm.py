"""Token mixers with a per-sequence state: Mamba 1 and 2 (selective state spaces) and gated DeltaNet
(linear attention), the shapes their transformers modules have.

* :class:`MambaSpec` - ``JambaMambaMixer`` (Mamba 1: ``in_proj``, depthwise ``conv1d``,
  ``x_proj``, ``dt_proj``, ``A_log [d_inner, N]``, ``D``, ``out_proj``, Jamba's dt/B/C
  RMSNorms) and the Mamba 2 mixers of Falcon-H1, Nemotron-H and Granite 4.0-H (``in_proj``
  to gate, x, B, C and dt; ``conv1d`` over x, B and C; per-head ``A_log``, ``D``, ``dt_bias``;
  a gated RMSNorm; ``out_proj``).
* :class:`LinearAttentionSpec` - Qwen3-Next's ``Qwen3NextGatedDeltaNet`` (``in_proj_qkvz``,
  ``in_proj_ba``, ``conv1d`` over q, k and v, per-value-head ``A_log`` and ``dt_bias``, a gated
  RMSNorm of one value head, ``out_proj``).

Their caches hold, per sequence and layer, a convolution state of ``conv_dim x kernel`` values
and a recurrent state (Mamba 1 ``d_inner x N``, Mamba 2 ``heads x head_dim x N``, gated DeltaNet
``value_heads x key_head_dim x value_head_dim``), independent of the sequence length.
Source: transformers 5.x modeling_jamba.py, modeling_falcon_h1.py, modeling_nemotron_h.py,
modeling_granitemoehybrid.py, modeling_qwen3_next.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens._compat import StrEnum
from vramlens.model.components import _require

__all__ = ["LinearAttentionSpec", "MambaSpec", "MambaVersion"]


class MambaVersion(StrEnum):
    """Which selective state-space mixer."""

    MAMBA1 = "mamba1"
    """Per-channel state ``d_inner x N``, input-dependent dt through a low-rank ``x_proj``/``dt_proj`` (Jamba)."""
    MAMBA2 = "mamba2"
    """Per-head scalar decay, B and C shared by head groups, chunked scan (Falcon-H1, Nemotron-H, Granite 4.0-H)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MambaSpec:
    """A Mamba mixer's shape."""

    version: MambaVersion
    intermediate_size: int
    """``d_inner``: the expanded width the scan runs over (``expand x hidden`` unless given)."""
    state_size: int
    """``N`` (``d_state``): state entries per channel (Mamba 1) or per head dimension (Mamba 2)."""
    conv_kernel: int
    """Width of the causal depthwise convolution (``d_conv``)."""
    num_heads: int = 1
    """Mamba 2 heads; ``d_inner = num_heads x head_dim``."""
    n_groups: int = 1
    """Mamba 2 groups sharing one B and one C."""
    time_step_rank: int = 0
    """Mamba 1 ``dt_rank``: the low-rank width of the time-step projection."""
    chunk_size: int = 256
    """Mamba 2 chunk length of the chunked scan (the sequence is padded to whole chunks)."""
    conv_bias: bool = True
    in_bias: bool = False
    """A bias on ``in_proj``."""
    out_bias: bool = False
    """A bias on ``out_proj``."""
    gated_norm: bool = True
    """Mamba 2: a gated RMSNorm of width ``d_inner`` before ``out_proj`` (Falcon-H1: ``mamba_rms_norm``)."""
    norm_before_gate: bool = False
    """The gated norm normalizes first and multiplies by ``silu(gate)`` after (Falcon-H1)."""
    inner_norms: bool = False
    """Jamba's RMSNorms on dt (``dt_rank``), B and C (``N`` each)."""
    activation: str = "silu"
    """Activation after the convolution."""

    def __post_init__(self) -> None:
        for name in ("intermediate_size", "state_size", "conv_kernel", "num_heads", "n_groups", "chunk_size"):
            _require(getattr(self, name) > 0, f"mamba.{name}: must be a positive integer")
        if self.version is MambaVersion.MAMBA1:
            _require(self.time_step_rank > 0, "mamba.time_step_rank: Mamba 1 needs a positive dt rank")
        else:
            _require(
                self.intermediate_size % self.num_heads == 0,
                f"mamba.num_heads: {self.num_heads} does not divide the inner width {self.intermediate_size}",
            )
            _require(
                self.num_heads % self.n_groups == 0,
                f"mamba.n_groups: {self.n_groups} does not divide the {self.num_heads} heads",
            )

    @property
    def head_dim(self) -> int:
        """Mamba 2 head width ``d_inner / heads``."""
        return self.intermediate_size // self.num_heads

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: ``d_inner`` (Mamba 1), ``d_inner + 2 G N`` (Mamba 2: x, B and C)."""
        if self.version is MambaVersion.MAMBA1:
            return self.intermediate_size
        return self.intermediate_size + 2 * self.n_groups * self.state_size

    @property
    def in_proj_size(self) -> int:
        """Outputs of ``in_proj``: x and gate (Mamba 1); gate, x, B, C and one dt per head (Mamba 2)."""
        if self.version is MambaVersion.MAMBA1:
            return 2 * self.intermediate_size
        return self.intermediate_size + self.conv_dim + self.num_heads

    @property
    def recurrent_state_elements(self) -> int:
        """Elements of one sequence's SSM state: ``d_inner x N`` (both versions)."""
        return self.intermediate_size * self.state_size


@dataclass(frozen=True, kw_only=True, slots=True)
class LinearAttentionSpec:
    """Gated DeltaNet linear attention (Qwen3-Next ``linear_attention`` layers)."""

    num_key_heads: int
    num_value_heads: int
    """Value heads; each query/key head serves ``value_heads / key_heads`` of them."""
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    chunk_size: int = 64
    """Chunk length of the chunked delta rule (transformers' torch implementation: 64)."""
    activation: str = "silu"

    def __post_init__(self) -> None:
        for name in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim", "conv_kernel", "chunk_size"):
            _require(getattr(self, name) > 0, f"linear_attention.{name}: must be a positive integer")
        _require(
            self.num_value_heads % self.num_key_heads == 0,
            f"linear_attention.num_value_heads: {self.num_value_heads} is not a multiple of the "
            f"{self.num_key_heads} key heads",
        )

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution over q, k and v: ``2 key_dim + value_dim``."""
        return 2 * self.key_dim + self.value_dim

    @property
    def recurrent_state_elements(self) -> int:
        """Elements of one sequence's state: ``value_heads x key_head_dim x value_head_dim``."""
        return self.num_value_heads * self.key_head_dim * self.value_head_dim
