"""The monotone-grid search against brute force on random up-sets."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from vramlens.planner.grid import first_fitting, minimal_fitting


def _brute_minimal(sizes: tuple[int, ...], generators: list[tuple[int, ...]]) -> set[tuple[int, ...]]:
    def fits(p: tuple[int, ...]) -> bool:
        return any(all(a >= b for a, b in zip(p, g, strict=True)) for g in generators)

    minimal = set()
    for point in itertools.product(*(range(n) for n in sizes)):
        back = [(*point[:i], point[i] - 1, *point[i + 1 :]) for i in range(len(point)) if point[i]]
        if fits(point) and not any(fits(b) for b in back):
            minimal.add(point)
    return minimal


@st.composite
def _up_sets(draw: st.DrawFn) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    sizes = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    point = st.tuples(*(st.integers(0, n - 1) for n in sizes))
    return sizes, draw(st.lists(point, max_size=6))


@settings(max_examples=300, deadline=None)
@given(_up_sets())
def test_minimal_fitting_equals_brute_force_and_asks_each_point_once(
    case: tuple[tuple[int, ...], list[tuple[int, ...]]],
) -> None:
    """Any up-set is the set of points above some generators; the search must find exactly its
    minimal points, calling ``fits`` at most once per point and never on a point above one it
    already found to fit on the same column (implied)."""
    sizes, generators = case
    asked: list[tuple[int, ...]] = []

    def fits(p: tuple[int, ...]) -> bool:
        asked.append(p)
        return any(all(a >= b for a, b in zip(p, g, strict=True)) for g in generators)

    found = minimal_fitting(sizes, fits)
    assert set(found) == _brute_minimal(sizes, generators)
    assert len(found) == len(set(found))
    assert len(asked) == len(set(asked)) <= max(1, len(list(itertools.product(*(range(n) for n in sizes)))))


def test_minimal_fitting_asks_few_points_of_a_large_grid() -> None:
    """A 6 x 3 x 3 x 3 x 10 grid (the planner's shape) whose fitting points need index >= 7 on
    the last axis everywhere: one column's bisection, then one call per other column."""
    sizes = (6, 3, 3, 3, 10)
    asked: list[tuple[int, ...]] = []

    def fits(p: tuple[int, ...]) -> bool:
        asked.append(p)
        return p[-1] >= 7

    assert minimal_fitting(sizes, fits) == [(0, 0, 0, 0, 7)]
    assert len(asked) < 6 * 3 * 3 * 3 + 5


def test_first_fitting_bisects() -> None:
    calls: list[int] = []

    def fits(i: int) -> bool:
        calls.append(i)
        return i >= 37

    assert first_fitting(fits, -1, 99) == 37
    assert len(calls) <= 7
