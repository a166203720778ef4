"""The stacked series every picture draws (report/series.py)."""

from __future__ import annotations

import numpy as np
import pytest

from vramlens.categories import Category
from vramlens.estimator import estimate
from vramlens.report.series import lod_indices, report_series, timeline_series
from vramlens.result.timeline import CATEGORY_ORDER, TimelineBuilder


def _code(category: Category) -> int:
    return CATEGORY_ORDER.index(category)


def _small() -> TimelineBuilder:
    """params 100 (load), activation 50 and 30 (forward), activation 50 freed and a
    gradient 100 (backward). Live: 100, 150, 180, 130, 230."""
    builder = TimelineBuilder(time_unit="ns")
    load, forward, backward = (builder.code("phase", name) for name in ("load", "forward", "backward"))
    rows = [
        (0, 100, Category.PARAMETERS, 0, load),
        (1_000_000, 50, Category.ACTIVATIONS, 1, forward),
        (2_000_000, 30, Category.ACTIVATIONS, 2, forward),
        (3_000_000, -50, Category.ACTIVATIONS, 1, backward),
        (4_000_000, 100, Category.GRADIENTS, 3, backward),
    ]
    for time, nbytes, category, storage, phase in rows:
        builder.append(time, nbytes, _code(category), storage, phase, -1, -1)
    return builder


def test_a_small_timeline_keeps_every_event() -> None:
    series = timeline_series(_small().build(), capacity_bytes=1000)
    assert series.x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0] and series.x_unit == "ms"
    assert series.categories == (Category.PARAMETERS, Category.GRADIENTS, Category.ACTIVATIONS)
    assert series.values.tolist() == [[100] * 5, [0, 0, 0, 0, 100], [0, 50, 80, 30, 30]]
    assert series.total.tolist() == [100, 150, 180, 130, 230]
    assert (series.peak_index, series.peak_bytes, series.peak_x) == (4, 230, 4.0)
    assert series.phases == (("load", 0.0, 0.0), ("forward", 1.0, 2.0), ("backward", 3.0, 4.0))
    assert series.capacity_bytes == 1000 and series.level == "tensor" and series.events == 5


def test_base_bytes_are_drawn_as_other() -> None:
    timeline = _small().build(base_bytes=7)
    series = timeline_series(timeline)
    other = series.categories.index(Category.OTHER)
    assert series.values[other].tolist() == [7] * 5
    assert series.total.tolist() == [107, 157, 187, 137, 237]
    assert np.array_equal(series.values.sum(axis=0), series.total)


def test_level_of_detail_keeps_the_peak_exact_and_the_stack_consistent() -> None:
    rng = np.random.default_rng(3)
    builder = TimelineBuilder(time_unit="event")
    live: list[tuple[int, int, int]] = []
    for index in range(20_000):
        if live and rng.random() < 0.48:
            storage, nbytes, code = live.pop(int(rng.integers(len(live))))
            builder.append(index, -nbytes, code, storage, -1, -1, -1)
        else:
            nbytes, code = int(rng.integers(1, 1000)), int(rng.integers(0, 4))
            builder.append(index, nbytes, code, index, -1, -1, -1)
            live.append((index, nbytes, code))
    timeline = builder.build()
    series = timeline_series(timeline, max_points=200)
    assert len(series.x) <= 200
    assert series.peak_bytes == timeline.peak_bytes
    assert series.source_index[series.peak_index] == timeline.peak_index
    assert np.array_equal(series.values.sum(axis=0), series.total)
    # Every drawn point is exact: the per-category bytes equal the breakdown after that event.
    for point in (0, series.peak_index, len(series.x) - 1):
        expected = timeline.breakdown_at(int(series.source_index[point]))
        drawn = {c: int(v) for c, v in zip(series.categories, series.values[:, point], strict=True) if v}
        assert drawn == expected


def test_lod_indices_keep_each_buckets_high_and_low() -> None:
    curve = np.array([0, 5, 1, 9, 2, 2, 8, 3], dtype=np.int64)
    # Two buckets of four: [0,5,1,9] keeps 9 (index 3) and 0 (index 0); [2,2,8,3] keeps 8 and 2.
    assert lod_indices(curve, 4).tolist() == [0, 3, 4, 6]
    assert lod_indices(curve, 8).tolist() == list(range(8))


def test_max_points_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="max_points"):
        timeline_series(_small().build(), max_points=1)


def test_an_estimate_is_drawn_over_its_phases() -> None:
    report = estimate({"model": "llama-3.2-1b", "seq": 1024, "gpu": "a100-80gb"})
    series = report_series(report)
    assert series.x_unit == "phase" and [name for name, _, _ in series.phases] == [p.name for p in report.phases]
    assert series.total.tolist() == [sum(p.breakdown.values()) for p in report.phases]
    assert series.peak_bytes == report.allocated_bytes
    assert series.capacity_bytes == report.capacity_bytes
