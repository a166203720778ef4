"""Replay a tensor timeline through a model of PyTorch's CUDA caching allocator.

``replay`` feeds allocation and free events to a pure-Python model of
``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``) and reports, after every
event, ``allocated`` (``torch.cuda.memory_allocated``: sizes of the blocks handed out) and
``reserved`` (``torch.cuda.memory_reserved``: cudaMalloc'd segments and mapped pages), their
peaks and the allocator slack at the reserved peak. No torch import; bytes are ``int``.

What is modeled, each following the PyTorch function named in its docstring (version and line
numbers: :mod:`vramlens.allocator._blocks`): 512-byte rounding and ``roundup_power2_divisions``;
small (<= 1 MiB) and large pools per stream; 2 MiB / 20 MiB / 2 MiB-rounded segments; best fit
by (size, address); ``should_split`` and merging of free neighbours; ``max_split_size`` and the
``max_non_split_rounding`` limit; expandable segments (2 MiB pages for the small pool, 20 MiB
for the large one); on a failed segment allocation ``release_available_cached_blocks``, then
``release_cached_blocks`` and a last retry before an out-of-memory error. Not modeled: CUDA
graph pools, ``recordStream`` events, ``empty_cache``, garbage collection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any

from vramlens.allocator._alloc_conf import parse_conf
from vramlens.allocator._blocks import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    ROUNDUP_INTERVALS,
    allocation_size,
    round_request,
)
from vramlens.allocator._caching import CachingAllocatorModel

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = [
    "AllocatorSettings",
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "ReplayResult",
    "replay",
    "round_size",
    "segment_size",
]


def _check_int(name: str, value: object, minimum: int, accepted: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"AllocatorSettings.{name}: expected {accepted}, got {value!r}")


def _is_division_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0 and value & (value - 1) == 0


@dataclass(frozen=True, kw_only=True)
class AllocatorSettings:
    """Allocator options (``PYTORCH_CUDA_ALLOC_CONF``) and the device capacity, in bytes.

    ``max_split_size_bytes``: None (default, unlimited) or >= 20 MiB, as ``max_split_size_mb``.
    ``roundup_power2_divisions``: 0 (off) or a power of two, for every size.
    ``roundup_power2_intervals``: optional per-interval divisions (16 entries: < 2 MiB, [2, 4) MiB,
    ..., >= 32 GiB), the list form ``roundup_power2_divisions:[256:1,512:2,>:4]``; overrides the
    single value. ``max_non_split_rounding_bytes``: how much larger than an oversize request a
    cached oversize block may be (``max_non_split_rounding_mb``, default 20 MiB).
    ``capacity_bytes``: device memory the allocator can reserve; None means unlimited.
    ``ignored_options``: config keys accepted by ``from_conf`` that the model does not apply.
    """

    max_split_size_bytes: int | None = None
    roundup_power2_divisions: int = 0
    expandable_segments: bool = False
    capacity_bytes: int | None = None
    max_non_split_rounding_bytes: int = K_LARGE_BUFFER
    roundup_power2_intervals: tuple[int, ...] | None = None
    ignored_options: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.max_split_size_bytes is not None:
            _check_int("max_split_size_bytes", self.max_split_size_bytes, K_LARGE_BUFFER, "None or an int >= 20 MiB")
        if not _is_division_count(self.roundup_power2_divisions):
            raise ValueError(
                f"AllocatorSettings.roundup_power2_divisions: expected 0 or a power of two, "
                f"got {self.roundup_power2_divisions!r}"
            )
        if not isinstance(self.expandable_segments, bool):
            raise ValueError(
                f"AllocatorSettings.expandable_segments: expected a bool, got {self.expandable_segments!r}"
            )
        if self.capacity_bytes is not None:
            _check_int("capacity_bytes", self.capacity_bytes, 1, "None or a positive int")
        _check_int(
            "max_non_split_rounding_bytes", self.max_non_split_rounding_bytes, K_LARGE_BUFFER, "an int >= 20 MiB"
        )
        intervals = self.roundup_power2_intervals
        if intervals is not None and (
            not isinstance(intervals, tuple)
            or len(intervals) != ROUNDUP_INTERVALS
            or not all(_is_division_count(v) for v in intervals)
        ):
            raise ValueError(
                f"AllocatorSettings.roundup_power2_intervals: expected None or a tuple of {ROUNDUP_INTERVALS} "
                f"ints, each 0 or a power of two, got {intervals!r}"
            )
        if not isinstance(self.ignored_options, tuple) or not all(isinstance(o, str) for o in self.ignored_options):
            raise ValueError(
                f"AllocatorSettings.ignored_options: expected a tuple of str, got {self.ignored_options!r}"
            )

    @classmethod
    def from_conf(cls, text: str, *, capacity_bytes: int | None = None) -> AllocatorSettings:
        """Parse ``PYTORCH_CUDA_ALLOC_CONF``, e.g. ``'max_split_size_mb:128,expandable_segments:True,
        roundup_power2_divisions:4'``. Unknown keys raise ValueError naming the key and listing
        the accepted ones; keys the model does not apply (``garbage_collection_threshold``,
        ``backend``, ``pinned_*``, ...) are accepted and listed in ``ignored_options``."""
        return cls(**parse_conf(text), capacity_bytes=capacity_bytes)

    def divisions_by_interval(self) -> tuple[int, ...]:
        """Power-of-two divisions for each of the 16 size intervals (0 or 1: no rounding)."""
        if self.roundup_power2_intervals is not None:
            return self.roundup_power2_intervals
        return (self.roundup_power2_divisions,) * ROUNDUP_INTERVALS


_DEFAULT_SETTINGS = AllocatorSettings()


@dataclass(frozen=True, kw_only=True, eq=False)
class ReplayResult:
    """What the allocator held after each event of a replay (bytes).

    ``peak_index`` is the first event after which ``reserved`` reached its maximum (-1 for an
    empty timeline) and ``fragmentation_bytes`` is reserved - allocated after that event: the
    cached but unused memory at the reserved peak. ``segments_created`` counts cudaMalloc'd
    segments, or with expandable segments the expandable segments (virtual ranges) created.
    """

    allocated_bytes: NDArray[np.int64]
    reserved_bytes: NDArray[np.int64]
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_index: int
    fragmentation_bytes: int
    segments_created: int
    ooms: tuple[int, ...]

    @property
    def fragmentation(self) -> float:
        """``fragmentation_bytes`` / ``peak_reserved_bytes``; 0.0 when nothing was reserved."""
        if self.peak_reserved_bytes == 0:
            return 0.0
        return self.fragmentation_bytes / self.peak_reserved_bytes


def round_size(nbytes: int, settings: AllocatorSettings | None = None) -> int:
    """Bytes the allocator sets aside for a request of ``nbytes``: its ``round_size``.

    At least 512 B, a multiple of 512 B, or the next power-of-two division when
    ``roundup_power2_divisions`` applies to the size (``round_size``, CUDACachingAllocator.cpp ~L2672).
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"round_size: nbytes must be a non-negative int, got {nbytes!r}")
    return round_request(nbytes, (settings or _DEFAULT_SETTINGS).divisions_by_interval())


def segment_size(rounded: int) -> int:
    """Bytes of the segment cudaMalloc'd for a rounded request (``get_allocation_size``, ~L3160):
    2 MiB up to 1 MiB, 20 MiB below 10 MiB, else the size rounded up to 2 MiB."""
    if isinstance(rounded, bool) or not isinstance(rounded, int) or rounded <= 0:
        raise ValueError(f"segment_size: rounded must be a positive int, got {rounded!r}")
    return allocation_size(rounded)


def replay(
    sizes: NDArray[np.int64],
    keys: NDArray[np.int64],
    streams: NDArray[np.integer[Any]] | None = None,
    settings: AllocatorSettings | None = None,
) -> ReplayResult:
    """Replay a timeline of allocations and frees through the caching-allocator model.

    ``sizes[i] > 0``: allocate that many raw bytes under ``keys[i]`` on ``streams[i]`` (default
    stream 0); ``sizes[i] < 0``: free the live allocation ``keys[i]`` (the magnitude is not
    used); 0: no-op. Freeing an unknown key is ignored; allocating a key that is live is a
    ValueError. With ``settings.capacity_bytes``, an allocation that still does not fit after
    the allocator released its cache is recorded in ``ooms`` and not allocated.
    """
    size_list, key_list, stream_list = _event_lists(sizes, keys, streams)
    chosen = settings or _DEFAULT_SETTINGS
    model = CachingAllocatorModel(
        divisions_by_interval=chosen.divisions_by_interval(),
        max_split_size=chosen.max_split_size_bytes,
        max_non_split_rounding=chosen.max_non_split_rounding_bytes,
        expandable=chosen.expandable_segments,
        capacity=chosen.capacity_bytes,
    )
    from vramlens.allocator._drive import drive  # the snapshot replay's loop; an estimate never loads it

    allocated, reserved, ooms = drive(model, size_list, key_list, stream_list)
    return _result(allocated, reserved, ooms, model.segments_created)


def _event_lists(sizes: Any, keys: Any, streams: Any) -> tuple[list[int], list[int], Any]:
    """Validate the event arrays and turn them into Python lists (no per-event numpy scalars)."""
    import numpy as np  # here, not at import: an estimate replays lists and never loads numpy

    size_array = np.asarray(sizes)
    key_array = np.asarray(keys)
    if size_array.ndim != 1 or key_array.shape != size_array.shape:
        raise ValueError(
            f"replay: sizes and keys must be 1-D of one length, got {size_array.shape} and {key_array.shape}"
        )
    if size_array.size and size_array.dtype.kind not in "iu":
        raise ValueError(f"replay: sizes must be integers, got dtype {size_array.dtype}")
    if streams is None:
        return size_array.tolist(), key_array.tolist(), repeat(0)
    stream_array = np.asarray(streams)
    if stream_array.shape != size_array.shape:
        raise ValueError(f"replay: streams must match sizes, got {stream_array.shape} and {size_array.shape}")
    return size_array.tolist(), key_array.tolist(), stream_array.tolist()


def _result(allocated: list[int], reserved: list[int], ooms: list[int], segments: int) -> ReplayResult:
    import numpy as np

    allocated_array = np.array(allocated, dtype=np.int64)
    reserved_array = np.array(reserved, dtype=np.int64)
    allocated_array.setflags(write=False)
    reserved_array.setflags(write=False)
    peak_index = int(np.argmax(reserved_array)) if reserved else -1
    fragmentation = int(reserved_array[peak_index] - allocated_array[peak_index]) if reserved else 0
    return ReplayResult(
        allocated_bytes=allocated_array,
        reserved_bytes=reserved_array,
        peak_allocated_bytes=int(allocated_array.max()) if allocated else 0,
        peak_reserved_bytes=int(reserved_array.max()) if reserved else 0,
        peak_index=peak_index,
        fragmentation_bytes=fragmentation,
        segments_created=segments,
        ooms=tuple(ooms),
    )
