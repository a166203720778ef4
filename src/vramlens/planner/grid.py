"""The minimal fitting points of a monotone grid: the search's core, free of workloads.

A grid has axes of given sizes, each ordered so that one step along it never turns a fitting
point into one that does not fit (the fitting points form an *up-set*). A fitting point is
*minimal* when no point one step back on any axis fits. Only minimal points can be worth
listing: every other fitting point saves more memory along some axis than a fitting
neighbour, at the price of that axis's step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

__all__ = ["first_fitting", "minimal_fitting"]

Point = tuple[int, ...]


def first_fitting(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The smallest index in (low, high] that fits, given that ``high`` fits and that the axis
    is monotone (bisection: about log2(high - low) calls of ``fits``)."""
    while high - low > 1:  # invariant: low does not fit (or is out of range), high fits
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle
    return high


def minimal_fitting(sizes: tuple[int, ...], fits: Callable[[Point], bool]) -> list[Point]:
    """The minimal fitting points of the grid ``sizes``, in visiting order.

    Columns (a choice of every axis but the last) are visited by increasing index sum, so a
    column's predecessors (one step back on one axis) come first. The last axis is bisected
    per column, bounded by the predecessors: by monotonicity a column's first fitting index is
    at most each predecessor's, and its first fitting point is minimal exactly when it is
    strictly earlier than every predecessor's. Most columns gain nothing over their
    predecessors, which one call (at the bound minus one) shows. ``fits`` is called at most
    once per point and never on a point implied to fit.
    """
    if not sizes or 0 in sizes:
        return []
    *heads, last = sizes
    first: dict[Point, int] = {}  # column -> its first fitting index on the last axis (last: none)
    minimal: list[Point] = []
    for column in sorted(itertools.product(*(range(n) for n in heads)), key=sum):
        before = [(*column[:i], column[i] - 1, *column[i + 1 :]) for i in range(len(column)) if column[i]]
        bound = min((first[c] for c in before), default=last)

        def at(index: int, column: Point = column) -> bool:
            return fits((*column, index))

        found = first_fitting(at, -1, bound - 1) if bound > 0 and at(bound - 1) else bound
        first[column] = found
        if found < bound:
            minimal.append((*column, found))
    return minimal
