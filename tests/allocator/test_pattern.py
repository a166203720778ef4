"""Allocation patterns (``vramlens.allocator.pattern``): the replay's two peaks, by hand.

Sizes follow ``CUDACachingAllocator.cpp`` as in ``test_allocator.py``: requests of 10 MiB and more
get a segment of their size rounded up to 2 MiB; a free block serves a smaller request by splitting.
"""

from __future__ import annotations

import numpy as np

from vramlens.allocator import AllocatorSettings, replay
from vramlens.allocator.pattern import Pattern, pattern_peaks
from vramlens.allocator.streams import Stream

MiB = 1 << 20


def test_a_freed_block_too_small_for_the_next_request_is_slack() -> None:
    p = Pattern()
    p.temporary(100 * MiB)  # a 100 MiB segment, then cached
    p.alloc(120 * MiB)  # does not fit in the 100 MiB block: a new 120 MiB segment
    peaks = pattern_peaks(p)
    assert peaks.allocated_bytes == 120 * MiB
    assert peaks.reserved_bytes == 220 * MiB
    assert peaks.slack_bytes == 100 * MiB


def test_a_smaller_request_reuses_the_freed_block() -> None:
    p = Pattern()
    p.temporary(120 * MiB)
    p.alloc(100 * MiB)  # split from the cached 120 MiB block
    assert pattern_peaks(p).reserved_bytes == 120 * MiB


def test_expandable_segments_grow_instead_of_stranding() -> None:
    p = Pattern()
    p.temporary(100 * MiB)
    p.alloc(120 * MiB)
    # One expandable segment: 100 MiB mapped (5 pages of 20 MiB), then 20 MiB more for 120 MiB.
    assert pattern_peaks(p, AllocatorSettings(expandable_segments=True)).reserved_bytes == 120 * MiB


def test_zero_sizes_make_no_event_and_their_frees_are_ignored() -> None:
    p = Pattern()
    key = p.alloc(0)
    p.free(key)
    assert key == -1 and p.events == []
    assert pattern_peaks(p).reserved_bytes == 0


def test_peaks_equal_the_timeline_replay() -> None:
    rng = np.random.default_rng(3)
    p = Pattern()
    live: list[int] = []
    for _ in range(400):
        if live and rng.random() < 0.45:
            p.free(live.pop(int(rng.integers(len(live)))))
        else:
            live.append(p.alloc(int(rng.integers(1, 64 * MiB)), int(rng.integers(3))))
    sizes = np.array([n for n, _, _ in p.events], dtype=np.int64)
    keys = np.array([k for _, k, _ in p.events], dtype=np.int64)
    streams = np.array([s for _, _, s in p.events], dtype=np.int32)
    reference = replay(sizes, keys, streams)
    peaks = pattern_peaks(p)
    assert peaks.allocated_bytes == reference.peak_allocated_bytes
    assert peaks.reserved_bytes == reference.peak_reserved_bytes


def test_a_block_freed_on_one_stream_is_not_reused_by_another() -> None:
    # CUDACachingAllocator.cpp get_free_block: the best fit must be of the requesting stream.
    p = Pattern()
    p.temporary(100 * MiB, Stream.REDUCE_SCATTER)  # a 100 MiB segment cached for the reduce-scatter stream
    p.alloc(80 * MiB)  # the compute stream cannot split it: a segment of its own
    assert pattern_peaks(p).reserved_bytes == 180 * MiB
    same = Pattern()
    same.temporary(100 * MiB, Stream.REDUCE_SCATTER)
    same.alloc(80 * MiB, Stream.REDUCE_SCATTER)
    assert pattern_peaks(same).reserved_bytes == 100 * MiB


def test_sharded_gradients_on_their_stream_keep_a_pool_of_their_own() -> None:
    # An FSDP-like step by hand: backward frees 100 MiB of activations, then the 30 MiB sharded
    # gradients are made (reduce-scatter stream), zero_grad frees them, the next forward asks for
    # 100 MiB of activations again.
    def step(gradient_stream: int) -> int:
        p = Pattern()
        p.temporary(100 * MiB)  # the activations: a 100 MiB segment, cached
        p.temporary(30 * MiB, gradient_stream)  # the gradients, freed by zero_grad
        p.alloc(100 * MiB)  # the next forward's activations
        return pattern_peaks(p).reserved_bytes

    # one stream: the gradients split the cached 100 MiB block, merge back when freed, and the
    # next activations reuse it whole: 100 MiB. Two streams: the gradients need a 30 MiB segment
    # of their own, cached for their stream: 100 + 30 MiB.
    assert step(Stream.DEFAULT) == 100 * MiB
    assert step(Stream.REDUCE_SCATTER) == 130 * MiB
