"""Allocation patterns: a short list of allocations and frees, replayed for its two peaks.

The analytic estimator describes a step as the tensors its terms imply, in the order the code
creates and frees them (:mod:`vramlens.estimator.reserved`); :func:`pattern_peaks` runs that
list through the caching-allocator model (:class:`~vramlens.allocator._caching.CachingAllocatorModel`,
the same model the simulator replays its recorded timelines through) and returns the peak of
``allocated`` and of ``reserved``. Each allocation names the stream it is made on (:class:`~vramlens.allocator.streams.Stream`;
a freed block is reused only by a later request of the same stream). No numpy, no per-event
arrays: a pattern has hundreds of events, and the estimator replays one per estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vramlens.allocator._caching import CachingAllocatorModel
from vramlens.allocator._replay import AllocatorSettings
from vramlens.allocator.streams import Stream

__all__ = ["Event", "Pattern", "PatternPeaks", "Repeat", "pattern_peaks"]

_DEFAULT = AllocatorSettings()
#: One event: ``(bytes, key, stream)`` allocates, ``(-1, key, 0)`` frees (see :class:`Pattern`).
Event = tuple[int, int, int]


class Pattern:
    """A growing list of events: ``alloc`` returns a key, ``free`` takes it.

    Sizes are raw request bytes (the allocator rounds them); a size of 0 allocates nothing and
    returns the key -1, whose free is a no-op (no event is written for either). Events are
    ``(nbytes, key, stream)``; a free's stream is unused (a block returns to its own stream's pool).
    """

    __slots__ = ("_next", "events")

    def __init__(self) -> None:
        self.events: list[tuple[int, int, int]] = []
        self._next = 0

    def alloc(self, nbytes: int, stream: int = Stream.DEFAULT) -> int:
        """Allocate ``nbytes`` (int >= 0) on ``stream``; returns the key to free it with. A symbolic
        size (an object whose ``symbolic`` is true, :class:`vramlens.estimator.size_symbols.Linear`)
        is recorded as it is, whatever it will be: a pattern of such sizes is a template whose
        non-positive requests are dropped, with their frees, when it is given values."""
        if type(nbytes) is not int and getattr(nbytes, "symbolic", False):
            key = self._next
            self._next += 1
            self.events.append((nbytes, key, int(stream)))
            return key
        if nbytes <= 0:
            return -1
        key = self._next
        self._next += 1
        self.events.append((int(nbytes), key, int(stream)))
        return key

    def free(self, key: int) -> None:
        """Free the allocation ``key`` (a no-op for a zero-byte one)."""
        if key >= 0:
            self.events.append((-1, key, 0))

    def free_all(self, keys: list[int]) -> None:
        """Free ``keys`` in order, then empty the list."""
        for key in keys:
            self.free(key)
        keys.clear()

    def temporary(self, nbytes: int, stream: int = Stream.DEFAULT) -> None:
        """A tensor created and freed at once (it raises the peak only while it lives)."""
        self.free(self.alloc(nbytes, stream))

    def __len__(self) -> int:
        return len(self.events)


@dataclass(frozen=True, kw_only=True, slots=True)
class PatternPeaks:
    """Peaks of one replayed pattern (bytes): ``allocated`` (sum of handed-out blocks) and
    ``reserved`` (segments and mapped pages), each over the whole pattern."""

    allocated_bytes: int
    reserved_bytes: int

    @property
    def slack_bytes(self) -> int:
        """Reserved peak minus allocated peak (what the allocator holds beyond the tensors)."""
        return self.reserved_bytes - self.allocated_bytes


def _model(settings: AllocatorSettings | None) -> CachingAllocatorModel:
    chosen = settings or _DEFAULT
    return CachingAllocatorModel(
        divisions_by_interval=chosen.divisions_by_interval(),
        max_split_size=chosen.max_split_size_bytes,
        max_non_split_rounding=chosen.max_non_split_rounding_bytes,
        expandable=chosen.expandable_segments,
    )


def _replay(
    model: CachingAllocatorModel, live: dict[int, object], events: Sequence[Event], peaks: tuple[int, int]
) -> tuple[int, int]:
    """Run ``events`` on ``model`` (``live``: the blocks by key); the peaks (allocated, reserved) so far."""
    malloc, release = model.malloc, model.free
    peak_allocated, peak_reserved = peaks
    for nbytes, key, stream in events:
        if nbytes > 0:
            block = malloc(nbytes, stream)
            live[key] = block
            if model.allocated > peak_allocated:
                peak_allocated = model.allocated
            if model.reserved > peak_reserved:
                peak_reserved = model.reserved
        else:
            found = live.pop(key, None)
            if found is not None:
                release(found)  # type: ignore[arg-type]
    return peak_allocated, peak_reserved


def pattern_peaks(pattern: Pattern, settings: AllocatorSettings | None = None) -> PatternPeaks:
    """Replay ``pattern`` through the caching-allocator model (one device, each allocation on its
    stream, no capacity limit) and return its peaks. Frees of unknown keys are ignored."""
    allocated, reserved = _replay(_model(settings), {}, pattern.events, (0, 0))
    return PatternPeaks(allocated_bytes=allocated, reserved_bytes=reserved)


@dataclass(frozen=True, slots=True)
class Repeat:
    """``count`` copies in a row of ``events``, which free every block they allocate (so the copies
    may use the same keys): replayed by :func:`vramlens.allocator.replaying.repeated_peaks`."""

    events: tuple[Event, ...]
    count: int
