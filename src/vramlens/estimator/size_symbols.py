"""Sizes as symbols: how a quantity depends on batch and sequence length, exactly.

The estimator's size-free parts are memoized on the resolved model; a part that does read the
sizes is usually a sum of per-token amounts. To learn which, and how, such code can be run once
with :class:`Linear` symbols in place of the sized inputs (tokens, batch, seq, and the stage's
sized quantities): a symbol supports only addition, subtraction and multiplication by an integer,
so every result is either a plain value that read no size at all, or an exact integer-linear
function of the sizes (:meth:`Linear.evaluate` gives its value for other sizes with the same
integer arithmetic). Any other use of a symbol - a comparison, a truth test, hashing, conversion
to ``int`` or ``float``, division, a float factor, formatting - raises :class:`SizeDependent`,
so code whose result or control flow depends on the sizes in any other way is never described
by symbols: its caller computes it for each workload instead.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

from vramlens.resolve.context import TrainingContext

T = TypeVar("T")

__all__ = ["UNAVAILABLE", "Linear", "SizeDependent", "merged_terms", "reads_no_size", "sized_context", "symbols"]


class SizeDependent(Exception):
    """A symbolic size was used other than linearly (see the module docstring)."""


def merged_terms(
    left: tuple[tuple[int, int], ...], right: tuple[tuple[int, int], ...], sign: int
) -> tuple[tuple[int, int], ...]:
    """The terms ``(input index, coefficient)`` of ``left + sign * right``, sorted, without zero coefficients."""
    merged = dict(left)
    for index, coefficient in right:
        merged[index] = merged.get(index, 0) + sign * coefficient
    return tuple(sorted((index, c) for index, c in merged.items() if c))


class Linear:
    """``sum(coefficient x size) + constant`` over the named sized inputs (integers only)."""

    __slots__ = ("constant", "terms")

    symbolic = True
    """Marks a symbolic size for code that records sizes without reading them
    (:meth:`vramlens.allocator.pattern.Pattern.alloc`)."""

    terms: tuple[tuple[int, int], ...]
    """(index of the sized input, integer coefficient), by index, no zero coefficient."""
    constant: int

    def __init__(self, terms: tuple[tuple[int, int], ...], constant: int = 0) -> None:
        self.terms = terms
        self.constant = constant

    def evaluate(self, sizes: Sequence[int | float]) -> int | float:
        """The value for the sized inputs ``sizes`` (indexed as the symbols were made)."""
        value: int | float = self.constant
        for index, coefficient in self.terms:
            value += coefficient * sizes[index]
        return value

    def _combine(self, other: object, sign: int) -> Linear:
        if isinstance(other, Linear):
            return Linear(merged_terms(self.terms, other.terms, sign), self.constant + sign * other.constant)
        if isinstance(other, int):
            return Linear(self.terms, self.constant + sign * other)
        raise SizeDependent(f"a size combined with {type(other).__name__}")

    def __add__(self, other: object) -> Linear:
        return self._combine(other, 1)

    def __radd__(self, other: object) -> Linear:
        return self._combine(other, 1)

    def __sub__(self, other: object) -> Linear:
        return self._combine(other, -1)

    def __rsub__(self, other: object) -> Linear:
        return (-self)._combine(other, 1)

    def __neg__(self) -> Linear:
        return Linear(tuple((index, -c) for index, c in self.terms), -self.constant)

    def __floordiv__(self, divisor: object) -> Linear:
        if divisor == 1 and isinstance(divisor, int):  # x // 1 is x (a context-parallel degree of 1)
            return self
        raise SizeDependent(f"a size divided by {divisor!r}")

    def __mul__(self, factor: object) -> Linear | int:
        if not isinstance(factor, int):
            raise SizeDependent(f"a size multiplied by {type(factor).__name__}")
        if factor == 0:
            return 0
        return Linear(tuple((index, c * factor) for index, c in self.terms), self.constant * factor)

    __rmul__ = __mul__

    def _refuse(self, *_: object) -> NoReturn:
        raise SizeDependent("a size compared, tested, hashed, converted or divided")

    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _refuse
    __bool__ = __hash__ = __index__ = __int__ = __float__ = __round__ = __trunc__ = _refuse
    __truediv__ = __rtruediv__ = __rfloordiv__ = __mod__ = __rmod__ = _refuse
    __divmod__ = __pow__ = __rpow__ = __lshift__ = __rshift__ = __and__ = __or__ = __xor__ = _refuse
    __abs__ = __invert__ = __pos__ = __format__ = __iter__ = __len__ = _refuse

    def __repr__(self) -> str:
        return f"Linear({self.terms!r}, {self.constant})"


def symbols(count: int) -> list[Linear]:
    """``count`` independent sized inputs, the ``i``-th standing for ``sizes[i]``."""
    return [Linear(((index, 1),)) for index in range(count)]


class _Unavailable:
    """Stands for something a symbolic run must not read (a stage's terms, whose bytes are sized):
    any use raises :class:`SizeDependent`."""

    __slots__ = ()

    def __getattr__(self, name: str) -> NoReturn:
        raise SizeDependent(f"read .{name} of something that depends on the sizes")

    def _refuse(self, *_: object) -> NoReturn:
        raise SizeDependent("used something that depends on the sizes")

    __iter__ = __len__ = __getitem__ = __contains__ = __bool__ = __eq__ = __hash__ = _refuse
    __format__ = __add__ = __radd__ = __mul__ = __rmul__ = _refuse


#: The stand-in for what a symbolic run must not read.
UNAVAILABLE: object = _Unavailable()


def sized_context(ctx: TrainingContext, tokens: object, batch: object, seq: object) -> TrainingContext:
    """``ctx`` with its tokens and its workload's batch and sequence length replaced (by symbols:
    the workload is copied without validation, which could not read them)."""
    workload = copy.copy(ctx.workload)
    object.__setattr__(workload, "batch", batch)
    object.__setattr__(workload, "seq", seq)
    return dataclasses.replace(ctx, workload=workload, tokens=tokens)  # type: ignore[arg-type]


def reads_no_size(
    build: Callable[[TrainingContext], T], ctx: TrainingContext, made: T, key: Callable[[T], object]
) -> bool:
    """Whether ``build(ctx)`` reads neither the tokens nor the batch nor the sequence length: built
    once more with symbols for them (:func:`sized_context`), it runs and gives ``made`` (compared by
    ``key``; a symbol left in the result refuses the comparison)."""
    try:
        return key(build(sized_context(ctx, *symbols(3)))) == key(made)
    except Exception:  # a size read (SizeDependent), or a TypeError from code given a symbol
        return False
