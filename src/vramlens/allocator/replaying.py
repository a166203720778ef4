"""Patterns replayed as they are written: each request goes to the allocator model at once.

:func:`~vramlens.allocator.pattern.pattern_peaks` replays a finished :class:`Pattern` (a list of
events) through :class:`~vramlens.allocator._caching.CachingAllocatorModel`. The estimator writes a
whole training step per estimate (10,000-30,000 requests) only to learn its two peaks, so
:func:`replaying_pattern` gives a :class:`Pattern` that keeps no events and replays each request as
it is made, with the same peaks (``tests/allocator/test_replaying.py`` checks them equal to
:func:`pattern_peaks` on random patterns under every setting, and on the estimator's step patterns).

Without expandable segments (PyTorch's default) the replay is :class:`FixedSegmentReplay`, the same
model written for this case alone: one device, no capacity (so no segment is ever released and
``release_available_cached_blocks`` never runs), fixed segments (2 MiB, 20 MiB, or the request
rounded up to 2 MiB: ``get_allocation_size``). It keeps no ``Block`` objects: a free block is its
(size, address) key in its pool's sorted list and two dicts (by start and by end address), an
allocated block a tuple; best fit, ``max_split_size``, ``should_split`` and the merging of free
neighbours within a segment follow :mod:`vramlens.allocator._caching` line for line. A temporary
(made and freed at once) that fits a cached block leaves the state as it was (the split block
merges back), so it only raises the allocated peak. With expandable segments every request goes
to :class:`~vramlens.allocator._caching.CachingAllocatorModel` itself.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from functools import partial
from typing import Any

from vramlens.allocator._blocks import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    KEY_SHIFT,
    SIZE_MAX,
    Block,
    cache_free_block,
    round_request,
)
from vramlens.allocator._caching import CachingAllocatorModel
from vramlens.allocator._replay import AllocatorSettings
from vramlens.allocator.pattern import Event, Pattern, PatternPeaks, Repeat
from vramlens.allocator.streams import Stream

__all__ = ["FixedSegmentReplay", "ModelReplay", "ReplayingPattern", "repeated_peaks", "replaying_pattern"]

_ADDRESS = (1 << KEY_SHIFT) - 1
_DEFAULT = AllocatorSettings()


class ReplayingPattern(Pattern):
    """A :class:`Pattern` whose requests are replayed as they are made; ``events`` stays empty."""

    __slots__ = ("peak_allocated", "peak_reserved")

    def __init__(self) -> None:
        super().__init__()
        self.peak_allocated = 0
        self.peak_reserved = 0

    def peaks(self) -> PatternPeaks:
        """The peaks so far (those :func:`~vramlens.allocator.pattern.pattern_peaks` gives the same requests)."""
        return PatternPeaks(allocated_bytes=self.peak_allocated, reserved_bytes=self.peak_reserved)

    def levels(self) -> tuple[int, int]:
        """(allocated, reserved) bytes now."""
        raise NotImplementedError

    def free_blocks(self) -> dict[int, list[tuple[int, int]]]:
        """The cached free blocks as (size, address), best fit first, by pool (``2 * stream + small``)."""
        raise NotImplementedError

    def state_key(self) -> object:
        """Equal for two states of one replay (with the same blocks allocated) only when every later
        sequence of requests behaves the same from both
        (:meth:`~vramlens.allocator._caching.CachingAllocatorModel.state_key`)."""
        raise NotImplementedError


def replaying_pattern(settings: AllocatorSettings | None = None) -> ReplayingPattern:
    """An empty pattern replayed under ``settings`` as it is written (see the module docstring)."""
    chosen = settings or _DEFAULT
    if chosen.expandable_segments or chosen.capacity_bytes is not None:
        return ModelReplay(chosen)
    return FixedSegmentReplay(chosen)


class ModelReplay(ReplayingPattern):
    """Each request replayed by :class:`~vramlens.allocator._caching.CachingAllocatorModel`."""

    __slots__ = ("_live", "_model")

    def __init__(self, settings: AllocatorSettings) -> None:
        super().__init__()
        self._model = CachingAllocatorModel(
            divisions_by_interval=settings.divisions_by_interval(),
            max_split_size=settings.max_split_size_bytes,
            max_non_split_rounding=settings.max_non_split_rounding_bytes,
            expandable=settings.expandable_segments,
        )
        self._live: dict[int, Block] = {}

    def alloc(self, nbytes: int, stream: int = Stream.DEFAULT) -> int:
        if nbytes <= 0:
            return -1
        key = self._next
        self._next += 1
        model = self._model
        block = model.malloc(int(nbytes), int(stream))
        assert block is not None  # no capacity: a segment can always be made
        self._live[key] = block
        self.peak_allocated = max(self.peak_allocated, model.allocated)
        self.peak_reserved = max(self.peak_reserved, model.reserved)
        return key

    def free(self, key: int) -> None:
        block = self._live.pop(key, None)
        if block is not None:
            self._model.free(block)

    def levels(self) -> tuple[int, int]:
        return self._model.allocated, self._model.reserved

    def state_key(self) -> object:
        return self._model.state_key()

    def free_blocks(self) -> dict[int, list[tuple[int, int]]]:
        found = {
            2 * pool.stream + pool.small: [(block.size, block.addr) for block in pool.blocks]
            for pool in self._model.pools()
        }
        return {number: blocks for number, blocks in found.items() if blocks}


class FixedSegmentReplay(ReplayingPattern):
    """The caching-allocator model without expandable segments or a capacity, for speed (see the
    module docstring). A free block is ``size << KEY_SHIFT | address`` in its pool's sorted list
    (``BlockComparatorSize`` within one stream), with ``_free_start[address] = size`` and
    ``_free_end[address + size] = address``; ``_segment_starts`` holds each segment's first address
    (a neighbour across one is in another segment and never merges). An allocated block is
    ``(address, size, pool)``. ``alloc``, ``free`` and ``temporary`` are written out in full, without
    helper calls: they run once per request."""

    __slots__ = (
        "_allocated",
        "_divisions",
        "_free_end",
        "_free_start",
        "_live",
        "_max_split",
        "_next_address",
        "_non_split_rounding",
        "_plain",
        "_pools",
        "_reserved",
        "_rounded",
        "_segment_starts",
    )

    def __init__(self, settings: AllocatorSettings) -> None:
        super().__init__()
        self._divisions = settings.divisions_by_interval()
        self._plain = all(divisions <= 1 for divisions in self._divisions)
        """No interval divided (PyTorch's default): ``round_size`` is the next multiple of 512 B."""
        max_split = settings.max_split_size_bytes
        self._max_split = SIZE_MAX if max_split is None else max_split
        self._non_split_rounding = settings.max_non_split_rounding_bytes
        self._rounded: dict[int, int] = {}
        self._pools: dict[int, list[int]] = {}
        self._free_start: dict[int, int] = {}
        self._free_end: dict[int, int] = {}
        self._segment_starts: set[int] = set()
        self._live: dict[int, tuple[int, int, list[int]]] = {}
        self._next_address = K_LARGE_BUFFER
        self._allocated = 0
        self._reserved = 0

    def _request(self, nbytes: int, stream: int) -> tuple[int, bool, list[int], int]:
        """(rounded size, small, its pool, the best-fit index in the pool or -1): ``round_size``,
        the pool by stream and size, ``get_free_block`` (an oversize block serves only a request of
        at least ``max_split_size`` that it exceeds by less than ``max_non_split_rounding``)."""
        size = self._rounded.get(nbytes)
        if size is None:
            size = self._rounded[nbytes] = round_request(int(nbytes), self._divisions)
        small = size <= K_SMALL_SIZE
        pool = self._pools.get(2 * stream + small)
        if pool is None:
            pool = self._pools[2 * stream + small] = []
        index = bisect_left(pool, size << KEY_SHIFT)
        if index < len(pool):
            block, max_split = pool[index] >> KEY_SHIFT, self._max_split
            if size < max_split <= block or (size >= max_split and block >= size + self._non_split_rounding):
                index = -1
        else:
            index = -1
        return size, small, pool, index

    def _segment(self, size: int, small: bool) -> tuple[int, int]:
        """``alloc_block``: a new segment for a rounded request (2 MiB up to 1 MiB, 20 MiB below
        10 MiB, else the size rounded up to 2 MiB); returns (address, bytes)."""
        nbytes = (
            K_SMALL_BUFFER
            if small
            else K_LARGE_BUFFER
            if size < K_MIN_LARGE_ALLOC
            else -(-size // K_ROUND_LARGE) * K_ROUND_LARGE
        )
        address = self._next_address
        self._next_address = address + nbytes
        self._segment_starts.add(address)
        self._reserved += nbytes
        if self._reserved > self.peak_reserved:
            self.peak_reserved = self._reserved
        return address, nbytes

    def alloc(self, nbytes: int, stream: int = Stream.DEFAULT) -> int:
        if nbytes <= 0:
            return -1
        key = self._next
        self._next = key + 1
        if self._plain:  # round_request without divisions, written out
            size = (
                -(-int(nbytes) // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE
                if nbytes > K_MIN_BLOCK_SIZE
                else K_MIN_BLOCK_SIZE
            )
        else:  # _request, written out
            known = self._rounded.get(nbytes)
            if known is None:
                known = self._rounded[nbytes] = round_request(int(nbytes), self._divisions)
            size = known
        small = size <= K_SMALL_SIZE
        pool = self._pools.get(2 * stream + small)
        if pool is None:
            pool = self._pools[2 * stream + small] = []
        index = bisect_left(pool, size << KEY_SHIFT)
        block = pool[index] >> KEY_SHIFT if index < len(pool) else 0
        max_split = self._max_split
        if block and not (
            size < max_split <= block or (size >= max_split and block >= size + self._non_split_rounding)
        ):
            address = pool.pop(index) & _ADDRESS
            del self._free_start[address]
            del self._free_end[address + block]
        else:
            address, block = self._segment(size, small)
        rest = block - size  # should_split: small pool >= 512 B left; large: below max_split, > 1 MiB left
        if rest >= K_MIN_BLOCK_SIZE if small else size < max_split and rest > K_SMALL_SIZE:
            self._free_start[address + size] = rest
            self._free_end[address + block] = address + size
            insort(pool, rest << KEY_SHIFT | (address + size))
            block = size
        self._live[key] = (address, block, pool)
        self._allocated += block
        if self._allocated > self.peak_allocated:
            self.peak_allocated = self._allocated
        return key

    def free(self, key: int) -> None:
        """``free_block``: merge the free neighbours within the segment, then cache the block."""
        found = self._live.pop(key, None)
        if found is None:
            return
        self._allocated -= found[1]
        cache_free_block(found, self._free_start, self._free_end, self._segment_starts)

    def temporary(self, nbytes: int, stream: int = Stream.DEFAULT) -> None:
        """Made and freed at once: a cached block that fits is split and merged back (the state
        is as it was), else a new segment is made and stays cached whole; only the peaks move."""
        if nbytes <= 0:
            return
        self._next += 1
        size, small, pool, index = self._request(nbytes, stream)
        if index >= 0:
            block = pool[index] >> KEY_SHIFT
        else:
            address, block = self._segment(size, small)
            self._free_start[address] = block
            self._free_end[address + block] = address
            insort(pool, block << KEY_SHIFT | address)
        rest = block - size
        split = rest >= K_MIN_BLOCK_SIZE if small else size < self._max_split and rest > K_SMALL_SIZE
        if self._allocated + (size if split else block) > self.peak_allocated:
            self.peak_allocated = self._allocated + (size if split else block)

    def levels(self) -> tuple[int, int]:
        return self._allocated, self._reserved

    def state_key(self) -> object:
        """The reserved bytes, the next segment's address and each pool's free blocks (size and
        address): the segments only grow, so equal reserved bytes mean the same segments."""
        return self._reserved, self._next_address, tuple((number, tuple(pool)) for number, pool in self._pools.items())

    def free_blocks(self) -> dict[int, list[tuple[int, int]]]:
        return {
            number: [(key >> KEY_SHIFT, key & _ADDRESS) for key in pool] for number, pool in self._pools.items() if pool
        }


def repeated_peaks(
    parts: Sequence[Sequence[Event] | Repeat], settings: AllocatorSettings | None = None
) -> tuple[PatternPeaks, tuple[int | None, ...]]:
    """Replay events and runs of copies (:class:`~vramlens.allocator.pattern.Repeat`) in order, each
    request as it comes (:func:`replaying_pattern`); the peaks, and for each run the copies replayed
    before one left the allocator as the copy before it had (None if none did).

    A run stops there: every later copy starts from that same state, makes the same requests,
    reaches the same peaks and leaves the same state, so it changes nothing
    (:meth:`ReplayingPattern.state_key`). The peaks are then those of any count of copies at least
    the number returned (``tests/allocator/test_repeated_peaks.py``: against
    :func:`~vramlens.allocator.pattern.pattern_peaks` of the copies written out)."""
    from vramlens.allocator._fixed_loop import replay_events  # where repeated runs are replayed (not one estimate)

    sink, live = replaying_pattern(settings), dict[int, Any]()
    if isinstance(sink, FixedSegmentReplay):
        replay = partial(replay_events, sink, live)
    else:
        replay = partial(_replay, sink, live)
    converged = list[int | None]()
    for part in parts:
        if not isinstance(part, Repeat):
            replay(part)
            continue
        before, found = sink.state_key(), None
        for copy in range(1, part.count + 1):
            replay(part.events)
            after = sink.state_key()
            if after == before:
                found = copy
                break
            before = after
        converged.append(found)
    return sink.peaks(), tuple(converged)


def _replay(sink: ReplayingPattern, live: dict[int, int], events: Sequence[Event]) -> None:
    """Write ``events`` into ``sink`` (``live``: the sink's key of each event key allocated and not
    freed; a free of an unknown key is ignored)."""
    alloc, free = sink.alloc, sink.free
    for nbytes, key, stream in events:
        if nbytes > 0:
            live[key] = alloc(nbytes, stream)
        else:
            found = live.pop(key, None)
            if found is not None:
                free(found)
