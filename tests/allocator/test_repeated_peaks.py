"""``repeated_peaks``: a run of identical blocks stops once a copy leaves the allocator as the copy
before it did (``ReplayingPattern.state_key``: the fast replay's, or ``CachingAllocatorModel``'s with expandable segments), and the peaks are those of the whole run for
every count at least the copies it replayed; checked against ``pattern_peaks`` of the events
written out, on random patterns under every allocator setting."""

from __future__ import annotations

import random

import pytest

from vramlens.allocator import AllocatorSettings
from vramlens.allocator.pattern import Pattern, Repeat, pattern_peaks
from vramlens.allocator.replaying import repeated_peaks

MiB = 1 << 20
SETTINGS = {
    "default": AllocatorSettings(),
    "expandable": AllocatorSettings.from_conf("expandable_segments:True"),
    "max split": AllocatorSettings.from_conf("max_split_size_mb:64"),
    "divisions": AllocatorSettings.from_conf("roundup_power2_divisions:4"),
}


def _block(rng: random.Random, first_key: int, streams: int) -> list[tuple[int, int, int]]:
    """Random allocations and frees that free everything they allocate, keys from ``first_key``."""
    events, live = [], []
    key = first_key
    for _ in range(rng.randint(1, 12)):
        if live and rng.random() < 0.4:
            events.append((-1, live.pop(rng.randrange(len(live))), 0))
            continue
        size = rng.choice([rng.randint(1, 2 * MiB), rng.randint(1, 64 * MiB), rng.randint(64 * MiB, 600 * MiB)])
        events.append((size, key, rng.randrange(streams)))
        live.append(key)
        key += 1
    rng.shuffle(live)
    events += [(-1, k, 0) for k in live]
    return events


def _written_out(prefix: list, block: list, count: int, suffix: list) -> list:
    return prefix + block * count + suffix


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_run_gives_the_peaks_of_its_copies_written_out(name: str) -> None:
    settings = SETTINGS[name]
    rng = random.Random(name)
    for _ in range(150):
        streams = rng.choice([1, 2])
        prefix = [(rng.randint(1, 200 * MiB), 10_000 + i, rng.randrange(streams)) for i in range(rng.randint(0, 3))]
        block = _block(rng, 0, streams)
        suffix = _block(rng, 1_000, streams)
        count = rng.randint(1, 5)
        peaks, converged = repeated_peaks([prefix, Repeat(events=tuple(block), count=count), suffix], settings)
        pattern = Pattern()
        pattern.events = _written_out(prefix, block, count, suffix)
        assert peaks == pattern_peaks(pattern, settings)
        (least,) = converged
        if least is not None:
            assert least <= count
            for more in (least, count + 1, count + 4):  # the same peaks for any count from least on
                pattern.events = _written_out(prefix, block, more, suffix)
                assert pattern_peaks(pattern, settings) == peaks


def test_a_run_that_reuses_its_blocks_stops_at_the_second_copy() -> None:
    """The micro-steps of gradient accumulation: the second copy reuses every block the first cached."""
    block = [(300 * MiB, 0, 0), (600 * MiB, 1, 0), (-1, 0, 0), (200 * MiB, 2, 0), (-1, 1, 0), (-1, 2, 0)]
    peaks, converged = repeated_peaks([[], Repeat(events=tuple(block), count=4)], AllocatorSettings())
    assert converged == (2,)
    pattern = Pattern()
    pattern.events = block * 4
    assert peaks == pattern_peaks(pattern)
