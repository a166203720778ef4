"""The trace columns' one-pass shortcuts (``time_us``, stack codes, ``category``) give what the
field-by-field reading gives, on the cases where the shortcut has to give up."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramlens.errors import InputError
from vramlens.snapshot import load_snapshot


def _entries(count: int = 6) -> list[dict[str, Any]]:
    stacks = [[{"filename": f"/s{i}.py", "line": i, "name": f"f{i}"}] for i in range(3)]
    order = [2, 0, 2, 1, 0, 2]  # stacks first used in the order 2, 0, 1
    return [
        {"action": "alloc", "addr": 512 * (i + 1), "size": 100, "stream": 0, "time_us": 10 + i}
        | {"frames": stacks[order[i % len(order)]]}
        for i in range(count)
    ]


def _trace(entries: list[dict[str, Any]]) -> Any:
    return load_snapshot({"segments": [], "device_traces": [entries]}).trace(0)


def test_times_read_in_one_pass() -> None:
    assert _trace(_entries()).time_us.tolist() == [10, 11, 12, 13, 14, 15]


@pytest.mark.parametrize("change", [lambda e: e.pop("time_us"), lambda e: e.update(time_us=None)])
def test_an_entry_without_a_time_drops_the_column(change: Any) -> None:
    entries = _entries()
    change(entries[3])
    assert _trace(entries).time_us is None


def test_a_bad_time_names_its_entry() -> None:
    entries = _entries()
    entries[4]["time_us"] = "soon"
    with pytest.raises(InputError, match=r"device_traces\[0\]\[4\]\.time_us: 'soon' is not a valid integer"):
        _trace(entries)


def test_stacks_are_numbered_in_order_of_first_use() -> None:
    snapshot = load_snapshot({"segments": [], "device_traces": [_entries()]})
    assert [stack[0].name for stack in snapshot.stacks] == ["f2", "f0", "f1"]
    assert snapshot.trace(0).stack.tolist() == [0, 1, 0, 2, 1, 0]


def test_category_column_only_when_an_entry_has_one() -> None:
    entries = _entries()
    assert _trace(entries).category is None
    entries[2]["category"] = None
    assert _trace(entries).category is None
    entries[5]["category"] = "activation"
    assert _trace(entries).category.tolist() == [-1, -1, -1, -1, -1, 0]


def _reference(entries: list[dict[str, Any]]) -> tuple[Any, list[int], list[tuple[str, ...]]]:
    """``time_us``, stack codes and stacks (function names) read entry by entry, the plain way."""
    times = [entry.get("time_us") for entry in entries]
    stacks: dict[tuple[str, ...], int] = {}
    codes = []
    for entry in entries:
        names = tuple(frame["name"] for frame in entry.get("frames") or ())
        codes.append(stacks.setdefault(names, len(stacks)) if names else -1)
    return (None if None in times else times), codes, list(stacks)


@given(st.data())
@settings(max_examples=150, deadline=None)
def test_fuzzed_entries_read_as_entry_by_entry(data: st.DataObject) -> None:
    shared = [[{"filename": "/a.py", "line": i, "name": f"f{i}"}] for i in range(4)]
    count = data.draw(st.integers(1, 40))
    entries = []
    for index in range(count):
        entry: dict[str, Any] = {"action": "alloc", "addr": 512 * (index + 1), "size": 8, "stream": 0}
        time = data.draw(st.sampled_from(["int", "int", "int", "missing", "none"]))
        if time != "missing":
            entry["time_us"] = index if time == "int" else None
        frames = data.draw(st.sampled_from(["shared", "shared", "copy", "none", "empty", "missing"]))
        if frames in ("shared", "copy"):
            stack = shared[data.draw(st.integers(0, 3))]
            entry["frames"] = stack if frames == "shared" else [dict(frame) for frame in stack]
        elif frames != "missing":
            entry["frames"] = None if frames == "none" else []
        entries.append(entry)
    snapshot = load_snapshot({"segments": [], "device_traces": [entries]})
    times, codes, stacks = _reference(entries)
    trace = snapshot.trace(0)
    assert (trace.time_us.tolist() if trace.time_us is not None else None) == times
    assert trace.stack.tolist() == codes
    assert [tuple(frame.name for frame in stack) for stack in snapshot.stacks] == stacks
