"""The event loop of :func:`~vramlens.allocator.replaying.repeated_peaks` on a fixed-segment replay,
with its ``alloc`` and ``free`` written out.

:func:`~vramlens.allocator.replaying.repeated_peaks` replays a few dozen requests per call (the
estimator's vocabulary slack, once per distinct set of sizes), each through a method call that
maps the event's key to the replay's own key and then to the block. :func:`replay_events` does
what :meth:`FixedSegmentReplay.alloc <vramlens.allocator.replaying.FixedSegmentReplay.alloc>` and
:meth:`~vramlens.allocator.replaying.FixedSegmentReplay.free` do, line for line, on the replay's
own state held in locals, and keeps each live block under the event's key; the replay's counters
and peaks are written back at the end. ``tests/allocator/test_repeated_peaks.py`` checks the peaks
against :func:`~vramlens.allocator.pattern.pattern_peaks` of the events written out, under every
setting this replay serves (default, ``max_split_size``, ``roundup_power2_divisions``).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vramlens.allocator._blocks import K_MIN_BLOCK_SIZE, K_SMALL_SIZE, KEY_SHIFT, cache_free_block, round_request

if TYPE_CHECKING:
    from vramlens.allocator.pattern import Event
    from vramlens.allocator.replaying import FixedSegmentReplay

__all__ = ["Live", "replay_events"]

_ADDRESS = (1 << KEY_SHIFT) - 1
#: A live block by its event's key: (address, bytes, its pool).
Live = dict[int, tuple[int, int, list[int]]]


def replay_events(sink: FixedSegmentReplay, live: Live, events: Sequence[Event]) -> None:
    """Allocate each positive-sized event and free each other event's key (a key not live is
    ignored), as ``sink.alloc`` and ``sink.free`` would (see the module docstring)."""
    pools, free_start, free_end, starts = sink._pools, sink._free_start, sink._free_end, sink._segment_starts
    rounded, divisions, plain = sink._rounded, sink._divisions, sink._plain
    max_split, non_split = sink._max_split, sink._non_split_rounding
    allocated, peak, made = sink._allocated, sink.peak_allocated, 0
    for nbytes, key, stream in events:
        if nbytes <= 0:
            found = live.pop(key, None)
            if found is not None:
                allocated -= found[1]
                cache_free_block(found, free_start, free_end, starts)
            continue
        made += 1
        if plain:  # round_request without divisions
            size = (
                -(-int(nbytes) // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE
                if nbytes > K_MIN_BLOCK_SIZE
                else K_MIN_BLOCK_SIZE
            )
        else:
            known = rounded.get(nbytes)
            if known is None:
                known = rounded[nbytes] = round_request(int(nbytes), divisions)
            size = known
        small = size <= K_SMALL_SIZE
        pool = pools.get(2 * stream + small)
        if pool is None:
            pool = pools[2 * stream + small] = []
        index = bisect_left(pool, size << KEY_SHIFT)
        block = pool[index] >> KEY_SHIFT if index < len(pool) else 0
        if block and not (size < max_split <= block or (size >= max_split and block >= size + non_split)):
            address = pool.pop(index) & _ADDRESS
            del free_start[address]
            del free_end[address + block]
        else:
            address, block = sink._segment(size, small)
        rest = block - size  # should_split: small pool >= 512 B left; large: below max_split, > 1 MiB left
        if rest >= K_MIN_BLOCK_SIZE if small else size < max_split and rest > K_SMALL_SIZE:
            free_start[address + size] = rest
            free_end[address + block] = address + size
            insort(pool, rest << KEY_SHIFT | (address + size))
            block = size
        live[key] = (address, block, pool)
        allocated += block
        if allocated > peak:
            peak = allocated
    sink._allocated, sink.peak_allocated = allocated, peak
    sink._next += made
