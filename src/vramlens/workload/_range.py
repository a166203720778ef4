"""The range a numeric workload key accepts (:class:`NumberRange`); the ranges themselves are
declared with their keys in :data:`vramlens.workload.keys.KEYS`."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["NumberRange", "number_text"]


@dataclass(frozen=True, kw_only=True, slots=True)
class NumberRange:
    """The values a numeric key accepts: ``low <= value <= high`` (``low < value`` when
    ``low_open``; ``value < high`` when ``high_open``)."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    why: str = ""
    """Why the bound is where it is (for ``docs/limits.md``)."""

    def holds(self, value: float) -> bool:
        """Whether ``value`` is finite and within the range (an ``int`` of any size compares
        exactly; ``math.isfinite`` would overflow on one beyond a float)."""
        if not isinstance(value, int) and not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def describe(self) -> str:
        """The range in words: ``from 1 to 1,048,576``, ``> 0 and <= 1000000``."""
        if not self.low_open and not self.high_open:
            return f"from {number_text(self.low)} to {number_text(self.high)}"
        low = f"{'>' if self.low_open else '>='} {number_text(self.low)}"
        high = f"{'<' if self.high_open else '<='} {number_text(self.high)}"
        return f"{low} and {high}"


def number_text(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() and abs(value) >= 1 else f"{value:g}"
