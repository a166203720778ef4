"""Each phase's first highest event (``forensics.view._first_highest``) against the one-sort
definition it replaced: order by (phase code, live bytes descending, position), first per code."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vramlens.forensics.view import _first_highest


def _by_sorting(live: np.ndarray, codes: np.ndarray) -> np.ndarray:
    order = np.lexsort((np.arange(len(live)), -live, codes))
    return order[np.r_[True, codes[order][1:] != codes[order][:-1]]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**40), 2**40), st.integers(-1, 6)), min_size=1, max_size=60))
def test_first_highest_is_the_sorted_definition(rows: list[tuple[int, int]]) -> None:
    live = np.array([row[0] for row in rows], np.int64)
    codes = np.array([row[1] for row in rows], np.int64)
    assert _first_highest(live, codes).tolist() == _by_sorting(live, codes).tolist()


def test_ties_take_the_first_position_and_codes_come_in_ascending_order() -> None:
    live = np.array([5, 9, 9, 1, 9, 3], np.int64)
    codes = np.array([2, 0, 0, -1, 2, -1], np.int64)
    assert _first_highest(live, codes).tolist() == [5, 1, 4]
