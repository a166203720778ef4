"""A model of PyTorch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``), in pure Python.

Used by the simulator (a recorded timeline replayed: :func:`replay`), by snapshot writing and
forensics, and by the analytic estimator, which replays the allocation pattern its own terms
imply (:mod:`vramlens.estimator.reserved`). Nothing here imports torch.
"""

from __future__ import annotations

from vramlens.allocator._replay import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    AllocatorSettings,
    ReplayResult,
    replay,
    round_size,
    segment_size,
)

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "AllocatorSettings",
    "ReplayResult",
    "replay",
    "round_size",
    "segment_size",
]
