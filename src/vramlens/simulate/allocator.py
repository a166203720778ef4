"""The caching-allocator replay, kept at its old import path: it now lives in :mod:`vramlens.allocator`
(shared with the analytic estimator, which must not import torch)."""

from __future__ import annotations

from vramlens.allocator import (
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
