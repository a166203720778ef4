"""The tracker of a replayed run: it notes where each allocation outside modules came from.

Used by :mod:`vramlens.simulator._replay` (read there what the notes are for).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from vramlens.result.timeline import Timeline
from vramlens.simulator._layers import LayerCut
from vramlens.trace._subclass import plain_tensors
from vramlens.trace.tracker import MemoryTracker, _may_allocate, torch

__all__ = ["NONE", "OUTSIDE", "LabelTracker", "grouped_frees", "take"]

#: ``source_unit`` / ``source_serial`` of an event with nothing to note.
NONE = -1
#: ``source_unit`` of a registered tensor outside the cut layers.
OUTSIDE = -3


class LabelTracker(MemoryTracker):  # type: ignore[no-untyped-call]
    """A tracker that also notes where each allocation outside modules came from."""

    def __init__(self, cut: LayerCut, *, capture_stacks: bool = False) -> None:
        super().__init__(capture_stacks=capture_stacks, clock="event")
        self.cut = cut
        self.layer_prefix = ""
        self.unit_of_storage: dict[int, int] = {}
        self.source_unit: list[int] = []
        """Per event: the unit of a registered layer tensor it allocates, else -1."""
        self.source_serial: list[int] = []
        """Per event: the tracked storage an allocation was made from, else -1."""
        self._source: Any = None
        self._key = 0
        self._registering = False

    def register_model(self, model: Any, *, name: str = "") -> None:
        """Learn the cut layers' tensors and module names, then register as usual."""
        if self.cut.region is None:  # nothing was cut: a plain run
            super().register_model(model, name=name)
            return
        root = name or type(model).__name__
        names = {id(module): f"{root}.{path}" if path else root for path, module in model.named_modules()}
        self.layer_prefix = names[id(self.cut.layer_list)]
        for position, layer in enumerate(self.cut.kept_layers):
            unit = self.cut.unit_of(self.cut.original_index(position))
            for tensor in plain_tensors([*layer.parameters(), *layer.buffers()]):  # FSDP2: the local shards
                self.unit_of_storage[id(tensor.untyped_storage())] = unit
        super().register_model(model, name=name)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self._paused or not _may_allocate(func):
            return out
        flat = [out] if isinstance(out, torch.Tensor) else torch.utils._pytree.tree_flatten(out)[0]
        outside = self._context.where()[1] < 0  # only allocations outside modules need their source
        sources = _sources(args, len(flat)) if outside else [None] * len(flat)
        for position, item in enumerate(flat):
            if isinstance(item, torch.Tensor):
                self._source = sources[position]
                self._track(item, None)
        self._source = None
        return out

    def _track(self, tensor: Any, category: Any, phase: int | None = None) -> None:
        self._key = id(tensor.untyped_storage()) if not tensor.is_meta else 0
        self._registering = category is not None
        super()._track(tensor, category, phase)

    def _resized(self, storage: Any, before: int, after: int) -> None:
        self._key, self._source, self._registering = id(storage), None, False
        super()._resized(storage, before, after)

    def _record(self, nbytes: int, code: int, serial: int, phase: int | None) -> None:
        super()._record(nbytes, code, serial, phase)
        unit = source = NONE
        if nbytes >= 0:
            unit = self.unit_of_storage.get(self._key, OUTSIDE if self._registering else NONE)
            if self._source is not None:
                found = self._live.get(id(self._source.untyped_storage()))
                source = found[0] if found is not None else NONE
        self.source_unit.append(unit)
        self.source_serial.append(source)


def _sources(args: Any, outputs: int) -> list[Any]:
    """Per output of an operator, the input tensor it is made from: the matching element of a
    tensor list as long as the outputs (``_foreach_*``), else the first tensor input."""
    first = None
    for arg in args:
        if (
            isinstance(arg, list | tuple)
            and outputs > 1
            and len(arg) == outputs
            and all(isinstance(item, torch.Tensor) for item in arg)
        ):
            return list(arg)
        if first is None:
            if isinstance(arg, torch.Tensor):
                first = arg
            elif isinstance(arg, list | tuple) and arg and isinstance(arg[0], torch.Tensor):
                first = arg[0]
    return [first] * outputs


def grouped_frees(timeline: Timeline, labels: list[int]) -> Any:
    """A permutation of the events that puts each burst of frees made outside any module whose
    units interleave in allocation order. Such a burst is autocast's weight cache being cleared
    at the end of the forward: the cache releases its casts in hash-table order, which changes
    from run to run (two full runs differ there); the live total after the burst is the same
    in any order and no peak falls inside a run of frees."""
    order = np.arange(len(timeline))
    frees = (timeline.nbytes < 0) & (timeline.module < 0)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], frees.astype(np.int8), [0]])))
    for first, stop in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
        burst = labels[first:stop]
        if not all(_together(burst, unit) for unit in (0, 1, 2)):
            order[first:stop] = first + np.argsort(timeline.storage[first:stop], kind="stable")
    return order


def _together(labels: list[int], unit: int) -> bool:
    """Whether ``unit``'s events are one stretch of ``labels`` (or absent)."""
    where = [index for index, label in enumerate(labels) if label == unit]
    return not where or where[-1] - where[0] + 1 == len(where)


def take(timeline: Timeline, order: Any) -> Timeline:
    """The timeline with its events in ``order`` (times unchanged: the event clock)."""
    columns = ("nbytes", "category", "phase", "module", "stack", "storage")
    return dataclasses.replace(timeline, **{name: getattr(timeline, name)[order] for name in columns})
