"""vramlens._untrusted.check_tree: the bulk count of dict runs equals the walk one by one."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramlens import _untrusted
from vramlens._untrusted import check_tree
from vramlens.errors import InputError


def _one_by_one(obj: Any, **limits: Any) -> int:
    """check_tree with the bulk path switched off."""
    original = _untrusted._TreeCheck._bulk
    _untrusted._TreeCheck._bulk = lambda self, chunk: None  # type: ignore[method-assign]
    try:
        return check_tree(obj, name="x", **limits)
    finally:
        _untrusted._TreeCheck._bulk = original  # type: ignore[method-assign]


def _entries(shared: list[Any], count: int, seed: int) -> list[Any]:
    """Trace-entry-like dicts pointing at shared lists (some nested), with a few other items."""
    out: list[Any] = []
    for i in range(count):
        pick = (i * 7 + seed) % (len(shared) + 2)
        entry: dict[str, Any] = {"action": "alloc", "addr": i, "size": i * 8}
        if pick < len(shared):
            entry["frames"] = shared[pick]
        elif pick == len(shared):
            out.append([i, [i]])  # a list child among the dicts
            continue
        out.append(entry)
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 5),
    st.integers(0, 900),
    st.integers(0, 50),
    st.booleans(),
)
def test_bulk_and_walk_count_the_same(stacks: int, count: int, seed: int, nest: bool) -> None:
    shared: list[Any] = [[{"filename": f"f{j}", "line": j}] * (j + 1) for j in range(stacks)]
    if nest and shared:
        shared.append([shared[0], shared[-1], {"deep": [[shared[0]]]}])
    tree = {"device_traces": [_entries(shared, count, seed)], "segments": shared}
    assert check_tree(tree, name="x", max_values=1 << 40) == _one_by_one(tree, max_values=1 << 40)


def test_a_cycle_through_a_dict_run_is_refused() -> None:
    entries: list[Any] = [{"a": 1} for _ in range(600)]
    entries[400]["back"] = entries
    with pytest.raises(InputError, match="contains itself"):
        check_tree({"t": entries}, name="x", max_values=1 << 30)


def test_depth_and_expansion_limits_hold_in_dict_runs() -> None:
    deep: Any = [1]
    for _ in range(70):
        deep = [deep]
    with pytest.raises(InputError, match="deeper"):
        check_tree([{"d": deep} for _ in range(300)], name="x", max_values=1 << 30)
    big = list(range(10_000))
    with pytest.raises(InputError, match="billion laughs"):
        check_tree([{"b": big} for _ in range(1000)], name="x", max_values=1_000_000)
