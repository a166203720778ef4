"""The range every numeric workload key accepts: one table, used by the loader, the dataclasses,
the web schema and the documentation.

Each bound is far beyond any real run (so no real workload is refused) and close enough that
an absurd value (a typo, ``1e18``, ``nan``) is a one-line error instead of an answer in
thousands of TiB. A number must also be finite: NaN and infinity are refused everywhere.

=========================  =====================  ===============================================
key                        accepted               why this bound
=========================  =====================  ===============================================
batch                      1 .. 1,048,576         2**20 sequences per rank (real: 1 to a few K)
seq                        1 .. 16,777,216        2**24 tokens (the longest contexts: 10M tokens)
grad_accum                 1 .. 1,048,576         2**20 micro-batches per step
recompute_every            1 .. 4,096             no model has more layers
prompt, context            1 .. 16,777,216        as seq
generate                   0 .. 16,777,216        as seq
max_num_batched_tokens     1 .. 16,777,216        as seq
max_num_seqs               1 .. 1,048,576         vLLM's default is 256 (1,024 on large GPUs)
block_size                 1 .. 65,536            vLLM uses 8 to 256 tokens per block
gpu_memory_utilization     0.01 .. 1              a fraction of the GPU (vLLM: 0 < x <= 1)
moe_capacity_factor        1 .. 1,024             GShard/Switch use 1 to 2
lora.rank                  1 .. 65,536            no hidden size reaches 65,536
lora.alpha                 > 0 .. 1,000,000       scaling only (alpha / rank); typical 8 to 256
lora.dropout               0 .. < 1               a probability
parallel.gpus              1 .. 1,048,576         2**20 GPUs (the largest clusters: ~10**5)
parallel.tp, pp, cp, ep    1 .. 65,536            each at most the GPUs of one job
parallel.shard_degree      1 .. 1,048,576         at most the GPUs
=========================  =====================  ===============================================

Tokens of one micro-batch (``batch x seq``, or ``batch x context`` in inference) are also at most
:data:`MAX_BATCH_TOKENS` (2**32): each key alone may be large, not both at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from vramlens._untrusted import brief
from vramlens.errors import InputError

__all__ = ["MAX_BATCH_TOKENS", "RANGES", "NumberRange", "check_range"]


@dataclass(frozen=True, kw_only=True, slots=True)
class NumberRange:
    """The values a numeric key accepts: ``low <= value <= high`` (``low < value`` when
    ``low_open``; ``value < high`` when ``high_open``)."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        """Whether ``value`` is finite and within the range."""
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def describe(self) -> str:
        """The range in words: ``from 1 to 1,048,576``, ``> 0 and <= 1000000``."""
        if not self.low_open and not self.high_open:
            return f"from {_number(self.low)} to {_number(self.high)}"
        low = f"{'>' if self.low_open else '>='} {_number(self.low)}"
        high = f"{'<' if self.high_open else '<='} {_number(self.high)}"
        return f"{low} and {high}"


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() and abs(value) >= 1 else f"{value:g}"


_TOKENS: Final = NumberRange(low=1, high=2**24)
_DEGREE: Final = NumberRange(low=1, high=2**16)
#: Workload key (``lora.rank`` for nested keys) -> its range (module docstring).
RANGES: Final[dict[str, NumberRange]] = {
    "batch": NumberRange(low=1, high=2**20),
    "seq": _TOKENS,
    "grad_accum": NumberRange(low=1, high=2**20),
    "recompute_every": NumberRange(low=1, high=4096),
    "prompt": _TOKENS,
    "generate": NumberRange(low=0, high=2**24),
    "context": _TOKENS,
    "max_num_batched_tokens": _TOKENS,
    "max_num_seqs": NumberRange(low=1, high=2**20),
    "block_size": NumberRange(low=1, high=2**16),
    "gpu_memory_utilization": NumberRange(low=0.01, high=1.0),
    "moe_capacity_factor": NumberRange(low=1.0, high=1024.0),
    "lora.rank": NumberRange(low=1, high=2**16),
    "lora.alpha": NumberRange(low=0, high=1e6, low_open=True),
    "lora.dropout": NumberRange(low=0, high=1, high_open=True),
    "parallel.gpus": NumberRange(low=1, high=2**20),
    "parallel.tp": _DEGREE,
    "parallel.pp": _DEGREE,
    "parallel.cp": _DEGREE,
    "parallel.ep": _DEGREE,
    "parallel.shard_degree": NumberRange(low=1, high=2**20),
}
#: Most tokens in one micro-batch (``batch x seq``; inference ``batch x context``): 2**32.
MAX_BATCH_TOKENS: Final = 2**32


def check_range(
    key: str, value: float, *, kind: str = "an integer", table_key: str | None = None, bounds: NumberRange | None = None
) -> None:
    """Raise a one-line :class:`InputError` naming ``key`` unless ``value`` is finite and within
    ``bounds`` (default: the range of ``table_key``, default ``key``, in :data:`RANGES`); ``kind``
    names what the key holds ("an integer", "a number")."""
    bounds = bounds or RANGES[table_key or key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{key}: must be {kind}, got {brief(value)}")
    if bounds.holds(value):
        return
    if not math.isfinite(value):
        raise InputError(f"{key}: must be a finite number, got {brief(value)}")
    low = value <= bounds.low if bounds.low_open else value < bounds.low
    if low:
        raise InputError(
            f"{key}: must be {kind} {'>' if bounds.low_open else '>='} {_number(bounds.low)}, got {brief(value)}"
        )
    raise InputError(
        f"{key}: must be {kind} {'<' if bounds.high_open else '<='} {_number(bounds.high)} "
        f"(accepted: {bounds.describe()}; larger is no real run), got {brief(value)}"
    )
