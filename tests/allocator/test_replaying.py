"""Patterns replayed as they are written (``vramlens.allocator.replaying``) against the reference,
:func:`~vramlens.allocator.pattern.pattern_peaks` (every event of a finished pattern through
``CachingAllocatorModel``): the same peaks, and after every request the same allocated and reserved
bytes and, at the end, the same cached free blocks at the same addresses, over random patterns
under every allocator setting the fast replay covers (and expandable segments, which go to the
model itself). The estimator's own step patterns are checked in ``tests/estimator/test_step_replay.py``.
"""

from __future__ import annotations

import random

import pytest

from vramlens.allocator import AllocatorSettings
from vramlens.allocator.pattern import Pattern, pattern_peaks
from vramlens.allocator.replaying import FixedSegmentReplay, ModelReplay, ReplayingPattern, replaying_pattern
from vramlens.allocator.streams import Stream

KiB, MiB = 1 << 10, 1 << 20
CONFS = (
    "",
    "max_split_size_mb:128",
    "max_split_size_mb:20,max_non_split_rounding_mb:64",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:1,512:2,>:8]",
    "max_split_size_mb:64,roundup_power2_divisions:2",
    "expandable_segments:True",
)
#: Sizes drawn from: a few repeated ones (ties between cached blocks), small (<= 1 MiB), 1-10 MiB
#: (20 MiB segments), large, and beyond the max_split_size settings above.
SIZES = (
    512,
    1000,
    8 * KiB,
    256 * KiB,
    1 * MiB,
    1 * MiB + 1,
    3 * MiB,
    9 * MiB + 7,
    10 * MiB,
    24 * MiB,
    64 * MiB,
    130 * MiB,
    500 * MiB + 300,
)


def _random_events(seed: int, count: int) -> list[tuple[str, int, int]]:
    """(op, size or index of the live key to free, stream): allocations, frees in any order, temporaries."""
    rng = random.Random(seed)
    events: list[tuple[str, int, int]] = []
    live = 0
    for _ in range(count):
        draw = rng.random()
        stream = rng.choice((Stream.DEFAULT, Stream.DEFAULT, Stream.ALL_GATHER, Stream.REDUCE_SCATTER))
        size = rng.choice(SIZES) if rng.random() < 0.6 else rng.randint(1, 200 * MiB)
        if live and draw < 0.42:
            events.append(("free", rng.randrange(live), 0))
            live -= 1
        elif draw < 0.5:
            events.append(("temporary", size, stream))
        elif draw < 0.52:
            events.append(("zero", 0, stream))
        else:
            events.append(("alloc", size, stream))
            live += 1
    return events


def _write(pattern: Pattern, events: list[tuple[str, int, int]], check: ReplayingPattern | None = None) -> None:
    """Write ``events`` into ``pattern`` (and, when given, the same into ``check``, comparing levels)."""
    keys: list[tuple[int, int]] = []
    for op, value, stream in events:
        if op == "alloc":
            keys.append((pattern.alloc(value, stream), check.alloc(value, stream) if check else -1))
        elif op == "free":
            key, other = keys.pop(value)
            pattern.free(key)
            if check:
                check.free(other)
        elif op == "temporary":
            pattern.temporary(value, stream)
            if check:
                check.temporary(value, stream)
        else:
            pattern.free(pattern.alloc(0, stream))
            pattern.free(-1)
        if check:
            assert isinstance(pattern, ReplayingPattern)
            assert pattern.levels() == check.levels()


@pytest.mark.parametrize("conf", CONFS)
@pytest.mark.parametrize("seed", range(6))
def test_replayed_as_written_is_the_replay_of_the_finished_pattern(conf: str, seed: int) -> None:
    settings = AllocatorSettings.from_conf(conf)
    events = _random_events(seed, 1500)
    written = Pattern()
    _write(written, events)
    fast = replaying_pattern(settings)
    _write(fast, events, check=ModelReplay(settings))  # level for level against the model
    assert fast.peaks() == pattern_peaks(written, settings)
    reference = ModelReplay(settings)
    _write(reference, events)
    assert fast.free_blocks() == reference.free_blocks()


def test_the_fast_replay_covers_fixed_segments_and_the_model_the_rest() -> None:
    assert type(replaying_pattern()) is FixedSegmentReplay
    assert type(replaying_pattern(AllocatorSettings(max_split_size_bytes=128 * MiB))) is FixedSegmentReplay
    assert type(replaying_pattern(AllocatorSettings(expandable_segments=True))) is ModelReplay
    assert type(replaying_pattern(AllocatorSettings(capacity_bytes=80 << 30))) is ModelReplay


def test_a_replaying_pattern_keeps_no_events_and_counts_keys_as_a_pattern_does() -> None:
    written, fast = Pattern(), replaying_pattern()
    for pattern in (written, fast):
        first = pattern.alloc(3 * MiB)
        pattern.temporary(5 * MiB)
        assert pattern.alloc(0) == -1
        assert pattern.alloc(MiB) == first + 2
    assert fast.events == [] and len(written) == 4


def test_a_temporary_that_fits_a_cached_block_leaves_it_as_it_was() -> None:
    fast = replaying_pattern()
    fast.free(fast.alloc(100 * MiB))
    before = fast.free_blocks()
    fast.temporary(30 * MiB)  # split from the cached 100 MiB block, then merged back
    assert fast.free_blocks() == before
    assert fast.peaks().allocated_bytes == 100 * MiB and fast.levels() == (0, 100 * MiB)
    fast.temporary(120 * MiB)  # does not fit: a 120 MiB segment, cached whole
    assert fast.levels() == (0, 220 * MiB)
    assert fast.free_blocks()[0] == [(100 * MiB, 20 * MiB), (120 * MiB, 120 * MiB)]
