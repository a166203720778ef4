"""OOM forensics: for each ``oom`` entry of a snapshot, what was live, what was asked for, what
the allocator held, and which changes would have avoided it, each with the bytes it saves.

Every suggestion is computed from the measured breakdown at the OOM, never canned:

* cached blocks (reserved - allocated) -> ``expandable_segments:True`` (PyTorch's own OOM
  message gives this advice when "reserved but unallocated memory is large");
* activations and inputs (the memory that scales with the batch) -> the smallest batch cut
  that frees the shortfall;
* activations inside numbered layers -> per-layer checkpointing keeps about one layer's
  activations (plus each layer's input, not counted);
* optimizer state -> an 8-bit optimizer (1 byte per fp32 element instead of 4);
* optimizer state and gradients -> ZeRO-2 / FSDP sharding over the fewest ranks that suffice.

The shortfall is the segment the allocator had to ``cudaMalloc`` (``get_allocation_size`` of
the rounded request, :mod:`vramlens.allocator`) minus the free bytes the driver
reported at the OOM. Bytes saved are upper bounds on allocated memory; freed blocks give
the shortfall back only when they free whole segments (or with expandable segments).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vramlens.allocator import ReplayResult, round_size, segment_size
from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.forensics.live import Lifetimes, LiveAllocation, live_allocations
from vramlens.result.timeline import CATEGORY_ORDER, Timeline
from vramlens.units import format_bytes

__all__ = ["OomForensics", "Suggestion", "explain_oom"]

_LAYER = re.compile(r"^(?P<layer>(?:.*\.)?(?:layers|layer|h|blocks|block)\.\d+)(?:\.|$)")
_ACTS = CATEGORY_ORDER.index(Category.ACTIVATIONS)


@dataclass(frozen=True, kw_only=True, slots=True)
class Suggestion:
    """A change that frees memory, with the bytes it saves at the OOM and how they were derived."""

    change: str
    saves_bytes: int
    avoids_oom: bool | None
    """Whether ``saves_bytes`` covers the shortfall (None when the shortfall is unknown)."""
    basis: str
    cost: int
    """Rank of the change's cost: 0 a setting, 1 the batch, 2 recomputation, 3 optimizer, 4 more GPUs."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {
            "change": self.change,
            "saves_bytes": self.saves_bytes,
            "avoids_oom": self.avoids_oom,
            "basis": self.basis,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class OomForensics:
    """One out-of-memory event explained."""

    event: int
    """The last event before the OOM (-1: none)."""
    phase: str
    """Phase of that event ("" if none)."""
    time_us: int | None
    requested_bytes: int
    device_free_bytes: int | None
    stream: int | None
    live_bytes: int
    """Tensor (requested) bytes live at the OOM."""
    allocated_bytes: int
    """Allocated (512-byte blocks) bytes live at the OOM."""
    breakdown: Mapping[Category, int]
    top_allocations: tuple[LiveAllocation, ...]
    reserved_bytes: int | None
    cached_bytes: int | None
    """Reserved but unallocated bytes (cached free blocks) at the OOM."""
    cached_source: str
    shortfall_bytes: int | None
    """Segment bytes needed beyond what the driver had free."""
    suggestions: tuple[Suggestion, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {
            "event": self.event,
            "phase": self.phase,
            "time_us": self.time_us,
            "requested_bytes": self.requested_bytes,
            "device_free_bytes": self.device_free_bytes,
            "stream": self.stream,
            "live_bytes": self.live_bytes,
            "allocated_bytes": self.allocated_bytes,
            "breakdown": {c.value: b for c, b in self.breakdown.items() if b},
            "top_allocations": [item.to_dict() for item in self.top_allocations],
            "reserved_bytes": self.reserved_bytes,
            "cached_bytes": self.cached_bytes,
            "cached_source": self.cached_source,
            "shortfall_bytes": self.shortfall_bytes,
            "suggestions": [item.to_dict() for item in self.suggestions],
        }


def _field(entry: Mapping[str, Any], key: str, *, required: bool = False) -> int | None:
    """An integer field of an OOM entry (None when absent and not required); else InputError."""
    value = entry.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"metadata.oom.{key}: expected an integer, got {value!r}")
    return value


def explain_oom(
    entry: Mapping[str, Any],
    *,
    timeline: Timeline,
    rounded: Timeline,
    lives: Lifetimes | None,
    replayed: ReplayResult | None,
    top: int = 10,
) -> OomForensics:
    """Explain one ``metadata["oom"]`` entry (``event``, ``requested_bytes``, ``device_free_bytes``,
    ``time_us``, ``stream``) of ``timeline`` (``rounded``: the same events at allocated level)."""
    event = max(-1, min(_field(entry, "event", required=True) or 0, len(timeline) - 1))
    requested = _field(entry, "requested_bytes", required=True) or 0
    free = _field(entry, "device_free_bytes")
    breakdown = rounded.breakdown_at(event) if event >= 0 else {}
    if rounded.base_bytes:
        breakdown[Category.OTHER] = breakdown.get(Category.OTHER, 0) + rounded.base_bytes
    reserved, cached, source = _cached(timeline, event, replayed)
    shortfall = None if free is None else max(segment_size(round_size(max(requested, 1))) - free, 0)
    layers = _layer_activations(timeline, lives, event) if lives is not None else {}
    batch = timeline.metadata.get("batch")
    suggestions = _suggestions(
        breakdown, layers, cached, shortfall, batch if isinstance(batch, int) and batch > 1 else None
    )
    code = int(timeline.phase[event]) if event >= 0 else -1
    return OomForensics(
        event=event,
        phase=timeline.phases[code] if code >= 0 else "",
        time_us=_field(entry, "time_us"),
        requested_bytes=requested,
        device_free_bytes=free,
        stream=_field(entry, "stream"),
        live_bytes=int(timeline.live_bytes[event]) if event >= 0 else timeline.base_bytes,
        allocated_bytes=int(rounded.live_bytes[event]) if event >= 0 else rounded.base_bytes,
        breakdown=breakdown,
        top_allocations=live_allocations(timeline, lives, event, top) if lives is not None else (),
        reserved_bytes=reserved,
        cached_bytes=cached,
        cached_source=source,
        shortfall_bytes=shortfall,
        suggestions=suggestions,
    )


def _cached(timeline: Timeline, event: int, replayed: ReplayResult | None) -> tuple[int | None, int | None, str]:
    """Reserved and cached bytes at the OOM: the snapshot's segments when it was dumped right
    after the OOM (no event after it), else the allocator replay, else unknown."""
    reserved = timeline.metadata.get("reserved_bytes")
    active = timeline.metadata.get("segments_allocated_bytes")
    if event == len(timeline) - 1 and isinstance(reserved, int) and isinstance(active, int):
        return reserved, reserved - active, "snapshot segments (dumped after the OOM)"
    if replayed is not None and event >= 0:
        held = int(replayed.reserved_bytes[event])
        return held, held - int(replayed.allocated_bytes[event]), "allocator replay (vramlens model, default settings)"
    return None, None, "unknown"


def _layer_activations(timeline: Timeline, lives: Lifetimes, event: int) -> dict[str, int]:
    """Live activation bytes at ``event`` per numbered layer (``...layers.3``, ``...h.3``, ``blocks.3``)."""
    if event < 0:
        return {}
    events = lives.start[lives.live_at(event)]
    totals: dict[str, int] = {}
    for index in events[timeline.category[events] == _ACTS].tolist():
        code = int(timeline.module[index])
        match = _LAYER.match(timeline.modules[code]) if code >= 0 else None
        if match:
            layer = match.group("layer")
            totals[layer] = totals.get(layer, 0) + int(timeline.nbytes[index])
    return totals


def _covers(saves: int, shortfall: int | None) -> bool | None:
    """Whether ``saves`` covers the shortfall (None when it is unknown or zero)."""
    return None if not shortfall else saves >= shortfall


def _suggestions(
    breakdown: Mapping[Category, int],
    layers: Mapping[str, int],
    cached: int | None,
    shortfall: int | None,
    batch: int | None,
) -> tuple[Suggestion, ...]:
    """Every applicable change, those that avoid the OOM first, then the cheapest."""
    found = [
        _expandable(cached, shortfall),
        _smaller_batch(breakdown, shortfall, batch),
        _checkpointing(layers, shortfall),
        _eight_bit(breakdown, shortfall),
        _sharding(breakdown, shortfall),
    ]
    chosen = [item for item in found if item is not None and item.saves_bytes > 0]
    return tuple(sorted(chosen, key=lambda item: (item.avoids_oom is not True, item.cost)))


def _expandable(cached: int | None, shortfall: int | None) -> Suggestion | None:
    """Cached free blocks -> expandable segments (saves the cached bytes)."""
    if not cached:
        return None
    return Suggestion(
        change="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        saves_bytes=cached,
        avoids_oom=_covers(cached, shortfall),
        basis=f"{format_bytes(cached)} reserved but unallocated (cached free blocks) at the OOM; "
        "expandable segments let freed memory serve larger requests instead of staying fragmented",
        cost=0,
    )


def _smaller_batch(breakdown: Mapping[Category, int], shortfall: int | None, batch: int | None) -> Suggestion | None:
    """Batch-proportional memory (activations + inputs) -> the smallest batch cut that covers the shortfall."""
    scaling = breakdown.get(Category.ACTIVATIONS, 0) + breakdown.get(Category.INPUTS, 0)
    if not scaling:
        return None
    basis = f"activations and inputs ({format_bytes(scaling)} live at the OOM) scale with the batch"
    if batch is not None:
        cut = next((k for k in range(1, batch) if scaling * k // batch >= (shortfall or 1)), batch - 1)
        saves = scaling * cut // batch
        return Suggestion(
            change=f"batch {batch} -> {batch - cut}", saves_bytes=saves, avoids_oom=_covers(saves, shortfall),
            basis=basis, cost=1,
        )  # fmt: skip
    share = 0.5 if not shortfall else min(shortfall / scaling, 1.0)
    percent = max(1, math.ceil(share * 100))
    saves = scaling * percent // 100
    return Suggestion(
        change=f"reduce the batch (or sequence length) by {percent}%", saves_bytes=saves,
        avoids_oom=_covers(saves, shortfall), basis=basis, cost=1,
    )  # fmt: skip


def _checkpointing(layers: Mapping[str, int], shortfall: int | None) -> Suggestion | None:
    """Activations in numbered layers -> per-layer checkpointing (keeps about the largest layer's)."""
    if len(layers) < 2:
        return None
    total, largest = sum(layers.values()), max(layers.values())
    saves = total - largest
    return Suggestion(
        change="activation checkpointing of each layer (e.g. model.gradient_checkpointing_enable())",
        saves_bytes=saves,
        avoids_oom=_covers(saves, shortfall),
        basis=f"{format_bytes(total)} of activations live in {len(layers)} layers (largest {format_bytes(largest)}): "
        "checkpointing keeps each layer's input and about one layer's activations",
        cost=2,
    )


def _eight_bit(breakdown: Mapping[Category, int], shortfall: int | None) -> Suggestion | None:
    """Optimizer state -> an 8-bit optimizer (saves 3/4 of fp32 state)."""
    state = breakdown.get(Category.OPTIMIZER_STATE, 0)
    saves = state * 3 // 4
    return Suggestion(
        change="an 8-bit optimizer (e.g. bitsandbytes AdamW8bit)",
        saves_bytes=saves,
        avoids_oom=_covers(saves, shortfall),
        basis=f"optimizer state {format_bytes(state)} live: 1 byte per element instead of 4 (if the state is fp32)",
        cost=3,
    )


def _sharding(breakdown: Mapping[Category, int], shortfall: int | None) -> Suggestion | None:
    """Optimizer state and gradients -> ZeRO-2/FSDP over the fewest ranks (2..64) that cover the shortfall."""
    sharded = breakdown.get(Category.OPTIMIZER_STATE, 0) + breakdown.get(Category.GRADIENTS, 0)
    if not sharded:
        return None
    ranks = next((n for n in (2, 4, 8, 16, 32, 64) if sharded - sharded // n >= (shortfall or 1)), 64)
    saves = sharded - sharded // ranks
    return Suggestion(
        change=f"shard optimizer state and gradients over {ranks} data-parallel ranks (ZeRO-2 / FSDP)",
        saves_bytes=saves,
        avoids_oom=_covers(saves, shortfall),
        basis=f"optimizer state and gradients {format_bytes(sharded)} live: each rank keeps 1/{ranks}",
        cost=4,
    )
