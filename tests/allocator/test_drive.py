"""The inlined replay loop (``allocator._drive.drive``) gives the figures of the loop that calls
the model's ``malloc`` / ``free`` (``drive_by_methods``) after every event, and leaves the model
in the same state, on random event sequences under every kind of allocator settings."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from vramlens.allocator import AllocatorSettings
from vramlens.allocator._caching import CachingAllocatorModel
from vramlens.allocator._drive import drive, drive_by_methods

MIB = 1 << 20
_SIZES = st.one_of(
    st.integers(1, 600), st.integers(1, MIB), st.integers(MIB, 12 * MIB), st.integers(12 * MIB, 80 * MIB)
)
_SETTINGS = st.sampled_from(
    [
        AllocatorSettings(),
        AllocatorSettings(roundup_power2_divisions=4),
        AllocatorSettings(capacity_bytes=64 * MIB),
        AllocatorSettings(max_split_size_bytes=40 * MIB, capacity_bytes=200 * MIB),
        AllocatorSettings(expandable_segments=True, capacity_bytes=120 * MIB),
    ]
)


@st.composite
def _events(draw: st.DrawFn) -> tuple[list[int], list[int], list[int]]:
    """Allocations and frees of random sizes, streams and lifetimes (frees of live keys, and
    sometimes of unknown ones)."""
    sizes, keys, streams, live = [], [], [], []
    for key in range(draw(st.integers(1, 120))):
        if live and draw(st.booleans()):
            sizes.append(-1)
            keys.append(live.pop(draw(st.integers(0, len(live) - 1))) if draw(st.integers(0, 9)) else 10**6)
        else:
            sizes.append(draw(_SIZES))
            keys.append(key)
            live.append(key)
        streams.append(draw(st.integers(0, 2)))
    return sizes, keys, streams


def _model(chosen: AllocatorSettings) -> CachingAllocatorModel:
    return CachingAllocatorModel(
        divisions_by_interval=chosen.divisions_by_interval(),
        max_split_size=chosen.max_split_size_bytes,
        max_non_split_rounding=chosen.max_non_split_rounding_bytes,
        expandable=chosen.expandable_segments,
        capacity=chosen.capacity_bytes,
    )


def _state(model: CachingAllocatorModel) -> list[Any]:
    """The pools' free blocks (stream, pool, key, address, size) and the model's counters."""
    blocks = [
        (pool.stream, pool.small, block.key, block.addr, block.size) for pool in model.pools() for block in pool.blocks
    ]
    return [blocks, model.allocated, model.reserved, model.segments_created]


@settings(max_examples=200, deadline=None)
@given(_events(), _SETTINGS)
def test_inlined_loop_gives_the_methods_figures(
    events: tuple[list[int], list[int], list[int]], chosen: AllocatorSettings
) -> None:
    sizes, keys, streams = events
    reference, inlined = _model(chosen), _model(chosen)
    assert drive(inlined, sizes, keys, streams) == drive_by_methods(reference, sizes, keys, streams)
    assert _state(inlined) == _state(reference)


def test_reuse_split_and_merge_take_the_inlined_path() -> None:
    """Small blocks carved from one 2 MiB segment, freed in an order that merges both sides."""
    sizes = [1000, 3000, 5000, -1, -1, -1, 2000, 700_000, -1]
    keys = [1, 2, 3, 2, 1, 3, 4, 5, 4]
    reference, inlined = _model(AllocatorSettings()), _model(AllocatorSettings())
    figures = drive(inlined, sizes, keys, [0] * len(sizes))
    assert figures == drive_by_methods(reference, sizes, keys, [0] * len(sizes))
    assert figures[1] == [2 * MIB] * len(sizes) and inlined.segments_created == 1
    assert figures[0] == [1024, 4096, 9216, 6144, 5120, 0, 2048, 702_464, 700_416]


def test_split_boundaries_of_both_pools() -> None:
    """A cached block is split when 512 B remain in the small pool (1024 B fragment, 512 B asked)
    and not when exactly 1 MiB remains in the large pool (20 MiB segment, 19 MiB asked)."""
    cases = [
        ([1024, 1000, -1, 512], [1, 2, 1, 3], 1024 + 512),
        ([20 * MIB, -1, 19 * MIB], [1, 1, 2], 20 * MIB),
    ]
    for sizes, keys, expected in cases:
        reference, inlined = _model(AllocatorSettings()), _model(AllocatorSettings())
        figures = drive(inlined, sizes, keys, [0] * len(sizes))
        assert figures == drive_by_methods(reference, sizes, keys, [0] * len(sizes))
        assert figures[0][-1] == expected
