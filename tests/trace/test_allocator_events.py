"""Merging the CPU allocator's events into a tracker timeline (pure; hand-made events)."""

from __future__ import annotations

import numpy as np
import pytest

from vramlens.categories import Category
from vramlens.result.timeline import CATEGORY_ORDER, Timeline
from vramlens.trace._allocator import AllocatorEvent, merge_allocator_events

START = 1_000_000_000  # Unix ns of the tracker's time 0
US = 1000  # times below are in microseconds
CODE = {category: index for index, category in enumerate(CATEGORY_ORDER)}


def tracker_timeline(rows: list[tuple[int, int, Category, str, int]]) -> Timeline:
    """(time us, signed bytes, category, phase, storage) rows as a tracker would record them."""
    phases = tuple(dict.fromkeys(row[3] for row in rows))
    n = len(rows)
    return Timeline(
        time=np.array([row[0] * US for row in rows], dtype=np.int64),
        nbytes=np.array([row[1] for row in rows], dtype=np.int64),
        category=np.array([CODE[row[2]] for row in rows], dtype=np.int8),
        phase=np.array([phases.index(row[3]) for row in rows], dtype=np.int32),
        module=np.full(n, -1, dtype=np.int32),
        stack=np.full(n, -1, dtype=np.int32),
        storage=np.array([row[4] for row in rows], dtype=np.int64),
        phases=phases,
        time_unit="ns",
    )


def at(us: int, ptr: int, nbytes: int) -> AllocatorEvent:
    """An allocator call ``us`` microseconds after the tracker's time 0."""
    return AllocatorEvent(time_ns=START + us * US, ptr=ptr, nbytes=nbytes)


def test_internal_allocations_become_temporaries_and_the_peak_is_the_allocators() -> None:
    # A registered 1000 B weight at 0xA (allocated before recording). An operator allocates
    # its 400 B output at 0xB and, inside itself, a 300 B copy at 0xC that it frees before
    # returning; the tracker sees the output at t=50. Then the output dies (t=90).
    timeline = tracker_timeline(
        [
            (0, 1000, Category.PARAMETERS, "load", 0),
            (50, 400, Category.ACTIVATIONS, "forward", 1),
            (90, -400, Category.ACTIVATIONS, "forward", 1),
        ]
    )
    events = [at(20, 0xB, 400), at(30, 0xC, 300), at(40, 0xC, -300), at(95, 0xB, -400)]
    merged = merge_allocator_events(timeline, {0: 0xA, 1: 0xB}, START, events)
    assert merged.nbytes.tolist() == [1000, 400, 300, -300, -400]
    # The dispatch mode alone peaks at 1400; the allocator at 1700 (output + copy + weight).
    assert timeline.peak_bytes == 1400 and merged.peak_bytes == 1700
    assert [CATEGORY_ORDER[c] for c in merged.category] == [
        Category.PARAMETERS,
        Category.ACTIVATIONS,
        Category.TEMPORARY,
        Category.TEMPORARY,
        Category.ACTIVATIONS,
    ]
    # The copy takes the phase of the operator whose output came next; frees keep the
    # allocator's time (the storage's Python object died at 90, the memory went at 95).
    assert [merged.phases[p] for p in merged.phase] == ["load", "forward", "forward", "forward", "forward"]
    assert (merged.time // US).tolist() == [0, 20, 30, 40, 95]
    assert merged.metadata["allocator_events"] is True


def test_a_registered_storage_is_freed_by_the_first_call_at_its_address() -> None:
    timeline = tracker_timeline(
        [(0, 800, Category.GRADIENTS, "load", 0), (70, -800, Category.GRADIENTS, "optimizer_step", 0)]
    )
    # The allocator frees 0xA at 60, then reuses it for an internal 800 B buffer.
    events = [at(60, 0xA, -800), at(65, 0xA, 800), at(66, 0xA, -800)]
    merged = merge_allocator_events(timeline, {0: 0xA}, START, events)
    assert merged.nbytes.tolist() == [800, -800, 800, -800]
    assert merged.storage.tolist() == [0, 0, 1, 1]
    assert merged.live_bytes.tolist() == [800, 0, 800, 0]


def test_address_reuse_pairs_each_free_with_its_own_allocation() -> None:
    # Two storages in turn at one address; the second one's tracker record comes 1 us late.
    timeline = tracker_timeline(
        [
            (10, 256, Category.ACTIVATIONS, "forward", 0),
            (20, -256, Category.ACTIVATIONS, "forward", 0),
            (31, 256, Category.TEMPORARY, "backward", 1),
            (40, -256, Category.TEMPORARY, "backward", 1),
        ]
    )
    events = [at(9, 0xD, 256), at(21, 0xD, -256), at(30, 0xD, 256), at(41, 0xD, -256)]
    merged = merge_allocator_events(timeline, {0: 0xD, 1: 0xD}, START, events)
    assert merged.storage.tolist() == [0, 0, 1, 1]
    assert [CATEGORY_ORDER[c] for c in merged.category] == [Category.ACTIVATIONS] * 2 + [Category.TEMPORARY] * 2
    assert (merged.time // US).tolist() == [9, 21, 30, 41]


def test_frees_of_memory_neither_side_saw_allocated_are_dropped() -> None:
    timeline = tracker_timeline([(10, 64, Category.ACTIVATIONS, "forward", 0)])
    events = [at(5, 0xE, -4096), at(9, 0xF, 64)]
    merged = merge_allocator_events(timeline, {0: 0xF}, START, events)
    assert merged.nbytes.tolist() == [64]
    assert merged.end_bytes == 64


def test_tracker_events_the_allocator_did_not_record_stay() -> None:
    # Recorded after the profiler stopped: no allocator call to pair with.
    timeline = tracker_timeline(
        [(10, 64, Category.ACTIVATIONS, "forward", 0), (500, -64, Category.ACTIVATIONS, "forward", 0)]
    )
    merged = merge_allocator_events(timeline, {0: 0xF}, START, [at(9, 0xF, 64)])
    assert merged.nbytes.tolist() == [64, -64]
    assert (merged.time // US).tolist() == [9, 500]


def test_only_ns_timelines_merge() -> None:
    timeline = tracker_timeline([(0, 8, Category.INPUTS, "load", 0)])
    import dataclasses

    with pytest.raises(ValueError, match="time_unit"):
        merge_allocator_events(dataclasses.replace(timeline, time_unit="event"), {}, START, [])
