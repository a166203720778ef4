"""``Timeline`` and ``TimelineBuilder`` on hand-built event lists (no torch).

Every expected number below is worked out by hand next to the events it comes from; the
property test checks the queries against a plain-Python running total.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.result.timeline import CATEGORY_ORDER, Timeline, TimelineBuilder

P, A, T, G = Category.PARAMETERS, Category.ACTIVATIONS, Category.TEMPORARY, Category.GRADIENTS


def code(category: Category) -> int:
    return list(Category).index(category)


def make(rows: list[tuple[int, Category, int, int, int]], **fields: Any) -> Timeline:
    """A timeline from (nbytes, category, phase code, module code, storage) rows."""
    n = len(rows)
    return Timeline(
        time=np.arange(n, dtype=np.int64),
        nbytes=np.array([r[0] for r in rows], dtype=np.int64),
        category=np.array([code(r[1]) for r in rows], dtype=np.int8),
        phase=np.array([r[2] for r in rows], dtype=np.int32),
        module=np.array([r[3] for r in rows], dtype=np.int32),
        stack=np.full(n, -1, dtype=np.int32),
        storage=np.array([r[4] for r in rows], dtype=np.int64),
        **fields,
    )


# Phases: 0 load, 1 forward, 2 backward, 3 optimizer_step (never used).
# Modules: 0 "M" (never used), 1 "M.0", 2 "M.1".
#   i  nbytes  category  phase  module storage   live (base 10)
ROWS = [
    (100, P, 0, -1, 0),  # 0                       110
    (50, A, 1, 1, 1),  # 1                         160
    (30, A, 1, 2, 2),  # 2                         190
    (20, T, 1, 2, 3),  # 3                         210
    (-20, T, 1, 2, 3),  # 4                        190
    (40, G, 2, 2, 4),  # 5                         230  <- peak
    (-30, A, 2, 2, 2),  # 6                        200
    (10, T, 2, 1, 5),  # 7                         210
    (-10, T, 2, 1, 5),  # 8                        200
    (-50, A, 2, -1, 1),  # 9                       150
]
LIVE = [110, 160, 190, 210, 190, 230, 200, 210, 200, 150]


@pytest.fixture
def timeline() -> Timeline:
    return make(
        ROWS,
        phases=("load", "forward", "backward", "optimizer_step"),
        modules=("M", "M.0", "M.1"),
        base_bytes=10,
    )


# --- derived curves and queries -------------------------------------------------------------


def test_live_bytes_is_base_plus_running_total(timeline: Timeline) -> None:
    assert timeline.live_bytes.tolist() == LIVE
    assert timeline.live_bytes.dtype == np.int64
    assert not timeline.live_bytes.flags.writeable
    assert len(timeline) == 10


def test_peak_end_and_base(timeline: Timeline) -> None:
    assert timeline.peak_bytes == 230
    assert timeline.peak_index == 5
    assert timeline.end_bytes == 150
    assert timeline.base_bytes == 10


def test_peak_index_is_the_first_maximum() -> None:
    # live: 8, 0, 8, 5 -> the maximum 8 is reached at events 0 and 2.
    timeline = make([(8, A, -1, -1, 0), (-8, A, -1, -1, 0), (8, A, -1, -1, 1), (-3, A, -1, -1, 1)])
    assert timeline.peak_index == 0
    assert timeline.peak_bytes == 8
    assert timeline.end_bytes == 5


def test_breakdown_defaults_to_the_peak_and_leaves_base_out(timeline: Timeline) -> None:
    # After event 5: parameters 100; activations 50 + 30; temporary 20 - 20 = 0 (omitted); gradients 40.
    expected = {P: 100, A: 80, G: 40}
    assert timeline.breakdown_at() == expected
    assert timeline.breakdown_at(5) == expected
    assert sum(expected.values()) == 230 - 10


def test_breakdown_at_a_given_index(timeline: Timeline) -> None:
    assert timeline.breakdown_at(0) == {P: 100}
    assert timeline.breakdown_at(3) == {P: 100, A: 80, T: 20}
    assert timeline.breakdown_at(7) == {P: 100, A: 50, G: 40, T: 10}
    assert timeline.breakdown_at(9) == {P: 100, G: 40}


def test_breakdown_before_the_first_event_is_empty(timeline: Timeline) -> None:
    assert timeline.breakdown_at(-1) == {}


@pytest.mark.parametrize("index", [10, 11, -2, -10])
def test_breakdown_outside_the_timeline_is_an_input_error(timeline: Timeline, index: int) -> None:
    with pytest.raises(InputError, match=rf"index: {index} is outside the timeline's 10 events"):
        timeline.breakdown_at(index)


def test_category_curves(timeline: Timeline) -> None:
    assert timeline.category_curve(A).tolist() == [0, 50, 80, 80, 80, 80, 50, 50, 50, 0]
    assert timeline.category_curve(T).tolist() == [0, 0, 0, 20, 0, 0, 0, 10, 0, 0]
    assert timeline.category_curve(Category("gradients")).tolist() == [0] * 5 + [40] * 5
    assert timeline.category_curve(Category.KV_CACHE).tolist() == [0] * 10


def test_phase_peaks_in_table_order_without_absent_phases(timeline: Timeline) -> None:
    # load: event 0 (110); forward: events 1-4 (max 210 at 3); backward: events 5-9 (230 at 5).
    peaks = timeline.phase_peaks()
    assert peaks == {"load": 110, "forward": 210, "backward": 230}
    assert list(peaks) == ["load", "forward", "backward"]


def test_module_peaks_skip_events_outside_modules(timeline: Timeline) -> None:
    # M.0: events 1, 7, 8 -> max(160, 210, 200); M.1: events 2-6 -> max(190, 210, 190, 230, 200).
    assert timeline.module_peaks() == {"M.0": 210, "M.1": 230}


def test_phase_spans(timeline: Timeline) -> None:
    assert timeline.phase_spans() == [("load", 0, 0), ("forward", 1, 4), ("backward", 5, 9)]


def test_phase_spans_repeat_phases_and_name_no_phase_empty() -> None:
    phases = [-1, -1, 0, 0, 1, 0]
    timeline = make([(1, A, p, -1, i) for i, p in enumerate(phases)], phases=("a", "b"))
    assert timeline.phase_spans() == [("", 0, 1), ("a", 2, 3), ("b", 4, 4), ("a", 5, 5)]


def test_peak_of_a_window(timeline: Timeline) -> None:
    assert timeline.peak_of(0, 10) == (230, 5)
    assert timeline.peak_of(0, 5) == (210, 3)
    assert timeline.peak_of(6, 10) == (210, 7)
    assert timeline.peak_of(9, 10) == (150, 9)


@pytest.mark.parametrize(("start", "stop"), [(0, 0), (5, 4), (-1, 3), (3, 11), (10, 11)])
def test_peak_of_outside_the_timeline_is_an_input_error(timeline: Timeline, start: int, stop: int) -> None:
    with pytest.raises(InputError, match=rf"range: {start}\.\.{stop} is outside"):
        timeline.peak_of(start, stop)


def test_empty_timeline() -> None:
    timeline = make([], base_bytes=7, phases=("load",), modules=("M",))
    assert len(timeline) == 0
    assert timeline.peak_index == -1
    assert timeline.peak_bytes == 7
    assert timeline.end_bytes == 7
    assert timeline.breakdown_at() == {}
    assert timeline.phase_peaks() == {}
    assert timeline.module_peaks() == {}
    assert timeline.phase_spans() == []
    assert timeline.category_curve(A).tolist() == []


# --- TimelineBuilder --------------------------------------------------------------------------


def test_builder_interns_names_per_table() -> None:
    builder = TimelineBuilder()
    assert builder.code("phase", "forward") == 0
    assert builder.code("phase", "backward") == 1
    assert builder.code("phase", "forward") == 0
    assert builder.code("module", "forward") == 0  # tables are separate
    assert builder.code("module", "Model.layers.0") == 1
    assert builder.code("stack", "a.py:1 in f") == 0
    assert builder.code("phase", None) == -1
    assert builder.code("module", None) == -1
    assert builder.code("stack", None) == -1
    timeline = builder.build()
    assert timeline.phases == ("forward", "backward")
    assert timeline.modules == ("forward", "Model.layers.0")
    assert timeline.stacks == ("a.py:1 in f",)
    assert len(timeline) == 0


def test_builder_columns_and_fields() -> None:
    builder = TimelineBuilder(time_unit="ns", level="allocated")
    fwd, layer = builder.code("phase", "forward"), builder.code("module", "M.0")
    builder.add(time=5, nbytes=64, category=code(A), storage=0, phase=fwd, module=layer)
    builder.add(time=9, nbytes=-64, category=code(A), storage=0)
    metadata = {"source": "test"}
    timeline = builder.build(base_bytes=3, metadata=metadata)
    metadata["source"] = "changed"
    assert timeline.time.tolist() == [5, 9]
    assert timeline.nbytes.tolist() == [64, -64]
    assert timeline.category.tolist() == [code(A), code(A)]
    assert timeline.phase.tolist() == [0, -1]
    assert timeline.module.tolist() == [0, -1]
    assert timeline.stack.tolist() == [-1, -1]
    assert timeline.storage.tolist() == [0, 0]
    dtypes = {name: getattr(timeline, name).dtype for name in ("time", "nbytes", "storage")}
    assert dtypes == {"time": np.int64, "nbytes": np.int64, "storage": np.int64}
    assert timeline.category.dtype == np.int8
    assert {timeline.phase.dtype, timeline.module.dtype, timeline.stack.dtype} == {np.dtype(np.int32)}
    assert (timeline.base_bytes, timeline.time_unit, timeline.level) == (3, "ns", "allocated")
    assert timeline.metadata == {"source": "test"}
    assert timeline.live_bytes.tolist() == [67, 3]


def test_builder_stays_usable_after_build() -> None:
    builder = TimelineBuilder()
    builder.add(time=0, nbytes=10, category=code(P), storage=0)
    first = builder.build()
    builder.add(time=1, nbytes=20, category=code(A), storage=1)
    second = builder.build()
    assert len(builder) == 2
    assert first.nbytes.tolist() == [10]
    assert second.nbytes.tolist() == [10, 20]


def test_builder_rejects_a_category_code_outside_the_table_on_build() -> None:
    builder = TimelineBuilder()
    builder.add(time=0, nbytes=10, category=len(CATEGORY_ORDER), storage=0)
    with pytest.raises(InputError, match=r"timeline\.category"):
        builder.build()


# --- validation in Timeline.__post_init__ ---------------------------------------------------


def columns(n: int = 3) -> dict[str, Any]:
    return {
        "time": np.arange(n, dtype=np.int64),
        "nbytes": np.ones(n, dtype=np.int64),
        "category": np.zeros(n, dtype=np.int8),
        "phase": np.zeros(n, dtype=np.int32),
        "module": np.zeros(n, dtype=np.int32),
        "stack": np.zeros(n, dtype=np.int32),
        "storage": np.arange(n, dtype=np.int64),
    }


TABLES = {"phases": ("p",), "modules": ("m",), "stacks": ("s",)}


def test_valid_columns_build() -> None:
    assert len(Timeline(**columns(), **TABLES)) == 3


@pytest.mark.parametrize("name", ["time", "category", "phase", "module", "stack", "storage"])
def test_a_column_of_another_length_is_named(name: str) -> None:
    fields = columns()
    fields[name] = fields[name][:2]
    with pytest.raises(InputError, match=rf"timeline\.{name}: must be a 1-D array of 3 events"):
        Timeline(**fields, **TABLES)


@pytest.mark.parametrize("name", ["time", "storage"])
def test_a_column_that_is_not_a_1d_array_is_named(name: str) -> None:
    fields = columns()
    as_list = dict(fields, **{name: fields[name].tolist()})
    with pytest.raises(InputError, match=rf"timeline\.{name}:"):
        Timeline(**as_list, **TABLES)
    two_d = dict(fields, **{name: fields[name].reshape(3, 1)})
    with pytest.raises(InputError, match=rf"timeline\.{name}:"):
        Timeline(**two_d, **TABLES)


@pytest.mark.parametrize(
    ("name", "value", "table_size"),
    [
        ("category", len(CATEGORY_ORDER), len(CATEGORY_ORDER)),
        ("category", -1, len(CATEGORY_ORDER)),
        ("phase", 1, 1),
        ("phase", -2, 1),
        ("module", 1, 1),
        ("module", -2, 1),
        ("stack", 1, 1),
        ("stack", -2, 1),
    ],
)
def test_codes_outside_their_table_are_named(name: str, value: int, table_size: int) -> None:
    fields = columns()
    fields[name] = fields[name].copy()
    fields[name][1] = value
    with pytest.raises(InputError, match=rf"timeline\.{name}: codes must index the {name} table of {table_size}"):
        Timeline(**fields, **TABLES)


def test_minus_one_means_none_for_phase_module_and_stack() -> None:
    fields = columns()
    for name in ("phase", "module", "stack"):
        fields[name] = np.full(3, -1, dtype=np.int32)
    timeline = Timeline(**fields)  # empty tables: -1 is still valid
    assert timeline.phase_spans() == [("", 0, 2)]


def test_a_code_into_an_empty_table_is_named() -> None:
    with pytest.raises(InputError, match=r"timeline\.phase: codes must index the phase table of 0"):
        Timeline(**columns(), modules=("m",), stacks=("s",))


def test_bad_time_unit_and_level_are_named() -> None:
    with pytest.raises(InputError, match=r"timeline\.time_unit: 'ms'; accepted: ns, event"):
        Timeline(**columns(), **TABLES, time_unit="ms")
    with pytest.raises(InputError, match=r"timeline\.level: 'reserved'; accepted: tensor, allocated"):
        Timeline(**columns(), **TABLES, level="reserved")


# --- property: breakdowns add up to the live curve ----------------------------------------------

_CATEGORIES = list(Category)


@st.composite
def event_lists(draw: st.DrawFn) -> tuple[list[tuple[int, int, int, int]], int]:
    """(nbytes, category code, phase code, storage) events: each storage allocated once and
    freed at most once, later; plus a base."""
    count = draw(st.integers(0, 25))
    sizes = draw(st.lists(st.integers(1, 10**12), min_size=count, max_size=count))
    cats = draw(st.lists(st.integers(0, len(_CATEGORIES) - 1), min_size=count, max_size=count))
    choices = draw(st.lists(st.integers(0, 10**6), min_size=2 * count, max_size=2 * count))
    events: list[tuple[int, int, int, int]] = []
    live: list[int] = []
    allocated = 0
    for choice in choices:
        if allocated < count and (not live or choice % 3):
            storage, allocated = allocated, allocated + 1
            live.append(storage)
            events.append((sizes[storage], cats[storage], choice % 4 - 1, storage))
        elif live:
            storage = live.pop(choice % len(live))
            events.append((-sizes[storage], cats[storage], choice % 4 - 1, storage))
    return events, draw(st.integers(0, 10**9))


@settings(max_examples=200, deadline=None)
@given(event_lists())
def test_breakdowns_add_up_to_live_bytes(case: tuple[list[tuple[int, int, int, int]], int]) -> None:
    events, base = case
    builder = TimelineBuilder()
    names = ("forward", "backward", "optimizer_step")
    for i, (nbytes, cat, phase, storage) in enumerate(events):
        builder.add(
            time=i,
            nbytes=nbytes,
            category=cat,
            storage=storage,
            phase=builder.code("phase", names[phase] if phase >= 0 else None),
        )
    timeline = builder.build(base_bytes=base)

    total, per_category, expected_live, phase_max = base, dict.fromkeys(_CATEGORIES, 0), [], {}
    for nbytes, cat, phase, _ in events:
        total += nbytes
        per_category[_CATEGORIES[cat]] += nbytes
        expected_live.append(total)
        if phase >= 0:
            phase_max[names[phase]] = max(phase_max.get(names[phase], total), total)
        breakdown = {c: v for c, v in per_category.items() if v}
        assert timeline.breakdown_at(len(expected_live) - 1) == breakdown
    assert timeline.live_bytes.tolist() == expected_live
    for i in range(len(timeline)):
        assert sum(timeline.breakdown_at(i).values()) == timeline.live_bytes[i] - base
    if events:
        assert timeline.peak_bytes == max(expected_live) == int(timeline.live_bytes.max())
        assert expected_live[timeline.peak_index] == max(expected_live)
        assert max(expected_live) not in expected_live[: timeline.peak_index]
        assert timeline.end_bytes == expected_live[-1]
    else:
        assert timeline.peak_bytes == base
    assert timeline.phase_peaks() == {name: phase_max[name] for name in timeline.phases if name in phase_max}
    for category in _CATEGORIES:
        assert int(timeline.category_curve(category)[-1:].sum()) == per_category[category]


# --- 10**7 events -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_ten_million_events() -> None:
    """5e6 allocations of (i % 7) + 1 bytes with category i % 3 (activations, temporary,
    gradients), phase forward and module a/b by parity, then the same storages freed in
    reverse order in phase backward with no module."""
    half = 5_000_000
    n = 2 * half
    i = np.arange(half, dtype=np.int64)
    sizes = i % 7 + 1
    cats = np.array([code(A), code(T), code(G)], dtype=np.int8)[i % 3]
    timeline = Timeline(
        time=np.arange(n, dtype=np.int64),
        nbytes=np.concatenate([sizes, -sizes[::-1]]),
        category=np.concatenate([cats, cats[::-1]]),
        phase=np.repeat(np.array([0, 1], dtype=np.int32), half),
        module=np.concatenate([(i % 2).astype(np.int32), np.full(half, -1, dtype=np.int32)]),
        stack=np.full(n, -1, dtype=np.int32),
        storage=np.concatenate([i, i[::-1]]),
        phases=("forward", "backward"),
        modules=("a", "b"),
    )
    # 5e6 = 7 * 714285 + 5: sizes 1..7 repeat 714285 times (28 bytes each), then 1..5.
    total = 714285 * 28 + 15
    # Category and size both repeat every 21 events: 5e6 = 21 * 238095 + 5.
    per_category = dict.fromkeys((A, T, G), 0)
    for k in range(21):
        per_category[(A, T, G)[k % 3]] += 238095 * (k % 7 + 1)
    for k in range(5):
        per_category[(A, T, G)[k % 3]] += k % 7 + 1
    assert sum(per_category.values()) == total
    # The last allocation is i = 4_999_999: size 4_999_999 % 7 + 1 = 5, category 4_999_999 % 3 = 1 (temporary).
    live = timeline.live_bytes
    assert len(live) == n
    assert timeline.peak_bytes == total
    assert timeline.peak_index == half - 1
    assert int(live[-1]) == 0
    assert int(live[half]) == total - 5
    assert timeline.breakdown_at() == per_category
    assert timeline.breakdown_at(half) == {**per_category, T: per_category[T] - 5}
    assert timeline.breakdown_at(n - 1) == {}
    assert timeline.phase_peaks() == {"forward": total, "backward": total - 5}
    # Module a runs the even allocations, b the odd ones; the last even one is 4_999_998 (before the size-5 one).
    assert timeline.module_peaks() == {"a": total - 5, "b": total}
