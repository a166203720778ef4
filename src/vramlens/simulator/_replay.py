"""Replayed layers: a training step of the cut model, expanded to the full model's events.

The model is built with its repeated region cut to three units ``U0``, ``U1``, ``U2``
(:mod:`vramlens.simulator._layers`) and the step runs for real under
:class:`~vramlens.simulator._labels.LabelTracker`, which notes, for each allocation made
outside any module (optimizer, ``zero_grad``, registration), the tracked tensor it came from. Every event then gets a
*unit*: the unit of the layer running it (the innermost module in forward, the module whose
backward began in backward), else the unit of the storage it frees or, for an allocation,
of the tensor it came from (or, made from nothing, the unit of the next allocation); a free
between layers (the decoder loop dropping the previous layer's output) belongs to the unit
that just ran when the storage is its own or its neighbour's, and so does a free of the
previous unit's temporary right after an allocation outside modules (a per-parameter
optimizer loop). A storage belongs to the unit of its allocation.

The full model runs ``U0``, ``U1``, ``k`` copies of ``U1`` and ``U2``. Each stretch of
``U1``'s events is followed by a stretch of ``U2``'s (forward order: forward, optimizer,
registration) or preceded by one (backward): the copies go between them, in that order,
each with its own storages and module names; what ``U1`` does with ``U0``'s storages a copy
does with the previous unit's, what it does with ``U2``'s with the next unit's (storages
are matched by their place in the unit's allocations), and ``U2`` works with the last copy's.
The expansion is refused (the step then runs in full) unless ``U0``, ``U1`` and ``U2``
allocate alike, every ``U1`` stretch has one ``U2`` neighbour and only neighbouring units
touch each other's storages. ``tests/simulator/test_replay.py`` checks, family by family,
that the result equals the full run event for event.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vramlens.result.timeline import Timeline
from vramlens.simulator._labels import NONE, OUTSIDE, LabelTracker, grouped_frees, take
from vramlens.simulator._layers import LayerCut

__all__ = ["Unresolved", "expand"]


class Unresolved(Exception):
    """The cut run cannot be expanded exactly; the step runs in full (or, with ``retry``, the
    region is tried again one unit later)."""

    def __init__(self, reason: str, *, retry: bool = False) -> None:
        super().__init__(reason)
        self.retry = retry


@dataclass(frozen=True, kw_only=True)
class Expanded:
    """The full model's events and where an event of the cut run landed."""

    timeline: Timeline
    new_index: Any
    """numpy array: the expanded index of each event of the cut run."""


def expand(timeline: Timeline, tracker: LabelTracker) -> Expanded:
    """The events of the full model (see the module doc); raises :class:`Unresolved`."""
    cut = tracker.cut
    assert cut.region is not None
    copies = cut.region.copies
    rename = _renamer(tracker.layer_prefix, cut)
    module_unit = np.array([_unit_of_name(name, tracker.layer_prefix, cut) for name in timeline.modules] + [-1])
    labels, owner = _labels(timeline, tracker, module_unit)
    order = grouped_frees(timeline, labels)
    timeline = take(timeline, order)
    labels = [labels[event] for event in order.tolist()]
    position, allocations = _positions(timeline, labels)
    _check(timeline, labels, owner, allocations, rename)
    if not allocations[1]:
        raise Unresolved("the template unit allocates nothing")
    tables = _ModuleTables(timeline.modules, rename, copies, module_unit)
    storages = _StorageMap(timeline, owner, position, allocations[1], copies)
    columns, new_index = _emit(timeline, _runs(labels), tables, storages, copies)
    _check_lifetimes(columns[0], columns[5])
    landed = np.empty_like(new_index)
    landed[order] = new_index
    return Expanded(timeline=_frozen(timeline, columns, tables.names), new_index=landed)


def _emit(
    timeline: Timeline, runs: list[tuple[int, int, int]], tables: _ModuleTables, storages: _StorageMap, copies: int
) -> tuple[list[Any], Any]:
    """The expanded columns (nbytes, category, phase, module, stack, storage) and where each
    event of the cut run landed: each template stretch with its copies beside it, in the order
    its neighbouring stretch of the last unit gives."""
    pieces: list[tuple[Any, ...]] = []
    new_index = np.empty(len(timeline), dtype=np.int64)
    emitted = 0
    for number, (first, stop, label) in enumerate(runs):
        sequence = [0]
        if label == 1:
            after = runs[number + 1][2] if number + 1 < len(runs) else None
            before = runs[number - 1][2] if number else None
            if after == 2 and before != 2:
                sequence = list(range(copies + 1))
            elif before == 2 and after != 2:
                sequence = list(range(copies, -1, -1))
            else:
                raise Unresolved("a stretch of the template unit has no single neighbour of the last unit")
        rows = slice(first, stop)
        for copy in sequence:
            if copy == 0:
                new_index[rows] = np.arange(emitted, emitted + stop - first)
            pieces.append(
                (
                    timeline.nbytes[rows],
                    timeline.category[rows],
                    timeline.phase[rows],
                    tables.codes(copy)[timeline.module[rows]],
                    timeline.stack[rows],
                    storages.of(rows, label, copy),
                )
            )
            emitted += stop - first
    return [np.concatenate([piece[i] for piece in pieces]) for i in range(6)], new_index


def _frozen(timeline: Timeline, columns: list[Any], modules: tuple[str, ...]) -> Timeline:
    """The expanded columns as a Timeline; storages numbered in the order they appear, as the
    tracker numbers them."""
    _, first_seen, inverse = np.unique(columns[5], return_index=True, return_inverse=True)
    serial = np.argsort(np.argsort(first_seen, kind="stable"), kind="stable")[inverse]
    return Timeline(
        time=np.arange(len(columns[0]), dtype=np.int64),
        nbytes=columns[0],
        category=columns[1].astype(np.int8),
        phase=columns[2].astype(np.int32),
        module=columns[3].astype(np.int32),
        stack=columns[4].astype(np.int32),
        storage=serial.astype(np.int64),
        phases=timeline.phases,
        modules=modules,
        stacks=timeline.stacks,
        base_bytes=timeline.base_bytes,
        time_unit=timeline.time_unit,
        level=timeline.level,
        metadata=dict(timeline.metadata),
    )


def _check_lifetimes(nbytes: Any, storage: Any) -> None:
    """Refuse an expansion in which a storage is freed before it is made, twice, or by another
    size than it was made with (a mislabelled event would do that)."""
    order = np.lexsort((np.arange(len(storage)), storage))
    serial, size = storage[order], nbytes[order]
    first = np.concatenate([[True], serial[1:] != serial[:-1]])
    if (size[first] < 0).any():
        raise Unresolved("a storage is freed before it is made")
    frees = np.flatnonzero(~first)
    if len(frees) and (
        (size[frees] >= 0).any() or (~first[frees - 1]).any() or (size[frees] != -size[frees - 1]).any()
    ):
        raise Unresolved("a storage is freed twice or by another size")


def _unit_of_name(name: str, prefix: str, cut: LayerCut) -> int:
    """Unit of a module name: 0-2 inside a region unit, -2 in another layer, -1 outside the layers."""
    if not name.startswith(prefix + "."):
        return -1
    head = name[len(prefix) + 1 :].split(".", 1)[0].split("<", 1)[0]
    if not head.isdigit():
        return -1
    position = int(head)
    return cut.unit_of(cut.original_index(position))


def _renamer(prefix: str, cut: LayerCut) -> Callable[[str, int], str]:
    """rename(name, copy): the full model's name of a cut-model module name (copy >= 1: the
    template unit's module in replayed unit ``copy``)."""
    assert cut.region is not None
    region = cut.region
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)(?=[.<]|$)")

    def rename(name: str, copy: int) -> str:
        def index(match: re.Match[str]) -> str:
            original = cut.original_index(int(match.group(1)))
            if copy:
                original += copy * region.period
            return f"{prefix}.{original}"

        return pattern.sub(index, name, count=1)

    return rename


def _labels(timeline: Timeline, tracker: LabelTracker, module_unit: Any) -> tuple[list[int], dict[int, int]]:
    """Each event's unit and each storage's owner unit (see the module doc). An allocation made
    from nothing outside modules (an optimizer's step counter, made before the moments of its
    parameter) takes the unit of the next allocation that has one: two passes."""
    labels, owner, made_from_nothing = _label_pass(timeline, tracker, module_unit, {})
    following = -1
    resolved: dict[int, int] = {}
    for event in range(len(labels) - 1, -1, -1):
        if event in made_from_nothing:
            resolved[event] = following
        elif int(timeline.nbytes[event]) > 0 and labels[event] is not None:
            following = labels[event]
    if not resolved:
        return labels, owner
    labels, owner, _ = _label_pass(timeline, tracker, module_unit, resolved)
    return labels, owner


def _label_pass(
    timeline: Timeline, tracker: LabelTracker, module_unit: Any, resolved: dict[int, int]
) -> tuple[list[int], dict[int, int], set[int]]:
    modules = timeline.module.tolist()
    nbytes = timeline.nbytes.tolist()
    storage = timeline.storage.tolist()
    unit_of_module = module_unit.tolist()
    owner: dict[int, int] = {}
    labels: list[int] = []
    made_from_nothing: set[int] = set()
    last = -1
    for event, module in enumerate(modules):
        unit = unit_of_module[module]
        if storage[event] not in owner:  # its allocation
            if module < 0:
                unit = tracker.source_unit[event]
                if unit == OUTSIDE:
                    unit = -1
                elif unit == NONE:
                    source = tracker.source_serial[event]
                    if source != NONE:
                        unit = owner.get(source, -1)
                    else:
                        made_from_nothing.add(event)
                        unit = resolved.get(event, -1)
            owner[storage[event]] = unit
        elif (unit == -1 or module < 0) and nbytes[event] < 0:
            unit = owner.get(storage[event], -1)
            after_allocation = event > 0 and nbytes[event - 1] >= 0
            if (
                last in (0, 1, 2)
                and unit in ((last - 1, last, last + 1) if module >= 0 else (last - 1,))
                and (module >= 0 or after_allocation)
            ):
                # freed between layers by the decoder loop, or a loop over parameters dropping the
                # previous one's temporary: it goes with the unit that just ran / is running
                unit = last
        labels.append(unit)
        last = unit
    return labels, owner, made_from_nothing


def _positions(timeline: Timeline, labels: list[int]) -> tuple[dict[int, int], dict[int, list[int]]]:
    """Each storage's place among its unit's allocations, and each unit's allocation events."""
    allocations: dict[int, list[int]] = {0: [], 1: [], 2: []}
    position: dict[int, int] = {}
    for event in sorted(np.unique(timeline.storage, return_index=True)[1].tolist()):
        unit = labels[event]
        if unit in allocations:
            position[int(timeline.storage[event])] = len(allocations[unit])
            allocations[unit].append(event)
    return position, allocations


def _check(
    timeline: Timeline,
    labels: list[int],
    owner: dict[int, int],
    allocations: dict[int, list[int]],
    rename: Callable[[str, int], str],
) -> None:
    """Refuse what the expansion cannot reproduce: units that allocate unlike, and storages
    touched by events of units that are not their neighbours in the full model."""

    def signature(event: int) -> tuple[Any, ...]:
        module = int(timeline.module[event])
        name = _relative(timeline.modules[module]) if module >= 0 else ""
        return (
            int(timeline.nbytes[event]),
            int(timeline.category[event]),
            int(timeline.phase[event]),
            name,
            int(timeline.stack[event]),
        )

    shapes = [[signature(event) for event in allocations[unit]] for unit in (0, 1, 2)]
    if not shapes[0] == shapes[1] == shapes[2]:
        raise Unresolved("the region's units allocate unlike", retry=shapes[1] == shapes[2])
    allowed = {0: {0, 1, -1, -2}, 1: {0, 1, 2}, 2: {1, 2, -1, -2}}
    for event, label in enumerate(labels):
        unit = owner.get(int(timeline.storage[event]), -1)
        if unit in allowed and label not in allowed[unit]:
            raise Unresolved("a unit's storage is used outside its neighbours")
        if label in (0, 2) and unit in (0, 2) and unit != label:
            raise Unresolved("the first and last units share a storage")
        if label == 1 and unit == -2:
            raise Unresolved("the template unit uses a storage of a layer outside the region")


_INDEX = re.compile(r"\.\d+(?=[.<]|$)")


def _relative(name: str) -> str:
    return _INDEX.sub(".#", name)


def _runs(labels: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of one label: (first event, stop, label)."""
    runs = []
    first = 0
    for event in range(1, len(labels) + 1):
        if event == len(labels) or labels[event] != labels[first]:
            runs.append((first, event, labels[first]))
            first = event
    return runs


class _ModuleTables:
    """The full model's module table (cut order, replayed units after the template's modules)
    and, per copy, the code of each cut-model module in it."""

    def __init__(self, names: tuple[str, ...], rename: Callable[[str, int], str], copies: int, unit: Any) -> None:
        table: dict[str, int] = {}
        template = [name for code, name in enumerate(names) if unit[code] == 1]
        last = max((code for code in range(len(names)) if unit[code] == 1), default=-1)
        base = []
        for code, name in enumerate(names):
            base.append(table.setdefault(rename(name, 0), len(table)))
            if code == last:
                for copy in range(1, copies + 1):
                    for other in template:
                        table.setdefault(rename(other, copy), len(table))
        self.names = tuple(table)
        self._maps = {0: np.array([*base, -1], dtype=np.int64)}
        self._table, self._names, self._unit, self._rename = table, names, unit, rename

    def codes(self, copy: int) -> Any:
        """Array: cut-model module code (-1 last) -> full-model code, for replayed unit ``copy``."""
        found = self._maps.get(copy)
        if found is None:
            found = self._maps[0].copy()
            for code, name in enumerate(self._names):
                if self._unit[code] == 1:
                    found[code] = self._table[self._rename(name, copy)]
            self._maps[copy] = found
        return found


class _StorageMap:
    """Storages of an emitted stretch: the template's own become the copy's, its neighbours'
    the neighbouring copies' (matched by their place in the unit's allocations)."""

    def __init__(
        self, timeline: Timeline, owner: dict[int, int], position: dict[int, int], template: list[int], copies: int
    ) -> None:
        self.storage = timeline.storage
        serials = timeline.storage.tolist()
        self.owner = np.array([owner.get(s, -1) for s in serials], dtype=np.int64)
        self.place = np.array([position.get(s, 0) for s in serials], dtype=np.int64)
        self.template = timeline.storage[template] if template else np.zeros(0, dtype=np.int64)
        self.size = len(template)
        self.fresh = int(timeline.storage.max()) + 1 if len(timeline) else 0
        self.copies = copies

    def unit_storage(self, copy: int, place: Any) -> Any:
        """Storage of the template's allocation ``place`` in unit copy ``copy`` (0: the template)."""
        if copy == 0:
            return self.template[place]
        return self.fresh + (copy - 1) * self.size + place

    def of(self, rows: slice, label: int, copy: int) -> Any:
        storage, owner, place = self.storage[rows], self.owner[rows], self.place[rows]
        if label == 1:
            result = np.where(owner == 1, self.unit_storage(copy, place), storage)
            if copy:
                result = np.where(owner == 0, self.unit_storage(copy - 1, place), result)
            if copy < self.copies:
                result = np.where(owner == 2, self.unit_storage(copy + 1, place), result)
            return result
        if label == 2:
            return np.where(owner == 1, self.unit_storage(self.copies, place), storage)
        return storage
