"""Pairing a trace's allocations with their frees, vectorised (numpy sorts, no per-event Python).

Rules (``docs/snapshot-format.md``; MemoryViz ``process_alloc_data``; PR #179489):

* an ``alloc`` is freed by the next ``free_completed`` at the same address (addresses are
  reused: every reuse is a new allocation). ``free_requested`` only marks the start of a free
  that waits for other streams; it is the free only in traces that have no
  ``free_completed`` at all (``skip_actions``), or for an allocation still open at the end
  whose block is no longer active in ``segments``;
* a free with no earlier allocation at its address (the allocation happened before recording
  began, or fell out of the ring buffer) is an *orphan*: the caller makes it a pre-existing
  allocation;
* an address allocated twice without a free in between lost its free: the first allocation is
  closed at a ``free_requested`` between the two if there is one, else just before the second.

The ordering key of an event at trace position ``i`` is ``2 * i + 1``; an implied free just
before position ``i`` gets ``2 * i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from vramlens.snapshot.model import ALLOC, ANNOTATE, FREE_COMPLETED, FREE_REQUESTED, Trace

__all__ = ["Pairs", "live_allocation", "pair_trace"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True, slots=True)
class Pairs:
    """Allocations of a trace (ascending trace position) and how each ends."""

    alloc: IntArray
    """Trace positions of the ``alloc`` entries."""
    free_key: IntArray
    """Ordering key of each allocation's free (-1: still live at the end)."""
    free_real: npt.NDArray[np.bool_]
    """Whether the free is a trace entry (False: implied just before a reuse of the address)."""
    orphans: IntArray
    """Trace positions of frees without an earlier allocation."""
    mentioned: npt.NDArray[np.uint64]
    """Sorted distinct addresses of the trace's allocations and frees."""


def _composite(
    addresses: npt.NDArray[np.uint64], positions: IntArray, universe: npt.NDArray[np.uint64], stride: int
) -> IntArray:
    """Keys ordering (address, trace position) pairs lexicographically: the address's rank in
    the sorted ``universe`` times ``stride`` (above every position), plus the position."""
    return np.searchsorted(universe, addresses).astype(np.int64) * np.int64(stride) + positions


def _contains(sorted_values: npt.NDArray[Any], queries: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """Whether each query is in ``sorted_values`` (sorted, distinct)."""
    if not len(sorted_values):
        return np.zeros(len(queries), bool)
    where = np.minimum(np.searchsorted(sorted_values, queries), len(sorted_values) - 1)
    return np.asarray(sorted_values[where] == queries)


def pair_trace(trace: Trace, active: npt.NDArray[np.uint64] | None) -> Pairs:
    """Pair ``trace``'s allocations and frees; ``active`` are the sorted addresses of blocks
    active in ``segments`` at dump time (None when the snapshot has no segments)."""
    action, addr = trace.action, trace.addr
    free_code = FREE_COMPLETED if bool((action == FREE_COMPLETED).any()) else FREE_REQUESTED
    chosen = np.flatnonzero((action == ALLOC) | (action == free_code))
    order = chosen[np.argsort(addr[chosen], kind="stable")]  # by address, then position
    sorted_addr, is_alloc = addr[order], action[order] == ALLOC
    same_next = np.zeros(len(order), bool)
    same_next[:-1] = sorted_addr[1:] == sorted_addr[:-1]
    next_alloc = np.zeros(len(order), bool)
    next_alloc[:-1] = is_alloc[1:]
    prev_alloc = np.zeros(len(order), bool)
    prev_alloc[1:] = is_alloc[:-1] & same_next[:-1]
    closer = np.append(order[1:], -1)  # the next entry at the same address, where same_next
    allocs = np.flatnonzero(is_alloc)
    double = same_next[allocs] & next_alloc[allocs]
    free_key = np.where(same_next[allocs], 2 * closer[allocs] + 1, -1)
    free_key[double] -= 1  # an implied free just before the reuse
    free_real = ~double
    if free_code == FREE_COMPLETED:
        _close_at_requests(trace, order[allocs], ~same_next[allocs], closer[allocs], free_key, free_real, active)
    # Back to trace order by scattering (no sort): every alloc position gets its own row.
    key_at, real_at = np.full(len(trace), -1, np.int64), np.zeros(len(trace), bool)
    key_at[order[allocs]], real_at[order[allocs]] = free_key, free_real
    orphan_at = np.zeros(len(trace), bool)
    orphan_at[order[~is_alloc & ~prev_alloc]] = True
    alloc_positions = np.flatnonzero(action == ALLOC)
    return Pairs(
        alloc=alloc_positions,
        free_key=key_at[alloc_positions],
        free_real=real_at[alloc_positions],
        orphans=np.flatnonzero(orphan_at),
        mentioned=sorted_addr[np.concatenate(([True], ~same_next[:-1]))] if len(order) else sorted_addr,
    )


def _close_at_requests(
    trace: Trace,
    positions: IntArray,
    open_end: npt.NDArray[np.bool_],
    closer: IntArray,
    free_key: IntArray,
    free_real: npt.NDArray[np.bool_],
    active: npt.NDArray[np.uint64] | None,
) -> None:
    """Close (in place) allocations whose ``free_completed`` is missing at a ``free_requested``:
    before a reuse of the address, or at the end when ``segments`` show the block inactive.
    ``positions``, ``open_end`` (no later entry at the address) and ``closer`` (the next
    entry's position) describe each allocation."""
    addr = trace.addr
    gone = open_end & ~_contains(active, addr[positions]) if active is not None else np.zeros(len(positions), bool)
    candidates = np.flatnonzero(~free_real | gone)
    requests = np.flatnonzero(trace.action == FREE_REQUESTED)
    if not len(requests) or not len(candidates):
        return
    cand_pos = positions[candidates]
    requests = requests[_contains(np.unique(addr[cand_pos]), addr[requests])]
    requests = requests[np.argsort(addr[requests], kind="stable")]
    universe = np.unique(addr[cand_pos])
    stride = len(trace) + 1
    found = np.searchsorted(
        _composite(addr[requests], requests, universe, stride),
        _composite(addr[cand_pos], cand_pos, universe, stride),
        "right",
    )
    hit = requests[np.minimum(found, max(len(requests) - 1, 0))] if len(requests) else np.full(len(found), -1)
    bound = np.where(open_end[candidates], np.iinfo(np.int64).max, closer[candidates])
    has = (found < len(requests)) & (addr[np.maximum(hit, 0)] == addr[cand_pos]) & (hit < bound)
    free_key[candidates[has]] = 2 * hit[has] + 1
    free_real[candidates[has]] = True


def live_allocation(trace: Trace, pairs: Pairs) -> IntArray:
    """For each ``annotate`` entry (in trace order), the index into ``pairs.alloc`` of the
    allocation live at its address at that moment (-1: none)."""
    positions = np.flatnonzero(trace.action == ANNOTATE)
    if not len(positions) or not len(pairs.alloc):
        return np.full(len(positions), -1, np.int64)
    addr = trace.addr
    universe = np.unique(np.concatenate([addr[pairs.alloc], addr[positions]]))
    keys = _composite(addr[pairs.alloc], pairs.alloc, universe, len(trace) + 1)
    by_key = np.argsort(keys, kind="stable")
    found = np.searchsorted(keys[by_key], _composite(addr[positions], positions, universe, len(trace) + 1), "right") - 1
    index = np.where(found >= 0, by_key[np.maximum(found, 0)], -1)
    chosen = pairs.alloc[np.maximum(index, 0)]
    alive = (pairs.free_key[np.maximum(index, 0)] < 0) | (pairs.free_key[np.maximum(index, 0)] > 2 * positions + 1)
    valid = (index >= 0) & (addr[chosen] == addr[positions]) & alive
    return np.where(valid, index, -1)
