"""What the recipe tracer shares between training and inference: the cut layer list, the
attribution of a tracked timeline to layers, lifetimes and peaks, the fits and their checks
(see :mod:`vramlens.simulator.recipe`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from vramlens._extras import require
from vramlens.categories import Category
from vramlens.errors import VramlensError
from vramlens.model.generic.layout import GenericLayout
from vramlens.model.generic.recipe import (
    RECIPE_TOLERANCE,
    Fit,
    check_size,
    fit_sizes,
    solve_fit,
)
from vramlens.result.timeline import CATEGORY_ORDER, Timeline
from vramlens.simulator._guard import DEFAULT_TIMEOUT_S, deadline, failure_message
from vramlens.simulator.build import SimulationError, real_code_paths

R = TypeVar("R")

_NOT_ACTIVATIONS = {
    CATEGORY_ORDER.index(c)
    for c in (Category.PARAMETERS, Category.BUFFERS, Category.INPUTS, Category.GRADIENTS, Category.OPTIMIZER_STATE)
}
_GRADIENTS = CATEGORY_ORDER.index(Category.GRADIENTS)


def _subset(layout: GenericLayout) -> list[int]:
    """The decoder layers kept, in model order: the first two of each kind (a kind's first layer
    may make tensors every layer of the kind, or every layer, shares, such as a mask built on
    first use: the second is the one measured, see :func:`_positions_of`), and after the last of
    those the next layer, so that no measured layer is the last one kept (the last layer's
    backward runs beside the LM head's leftovers)."""
    kinds = layout.layer_kinds
    seen: dict[int, int] = {}
    chosen = []
    for index, kind in enumerate(kinds):
        if seen.get(kind, 0) < 2:
            seen[kind] = seen.get(kind, 0) + 1
            chosen.append(index)
    if chosen[-1] + 1 < layout.num_layers:
        chosen.append(chosen[-1] + 1)
    return chosen


def _truncate(layout: GenericLayout, chosen: list[int], kept: list[Any]) -> Callable[[Any], None]:
    """Replace the model's decoder layer list by the ``chosen`` layers (on the meta device)."""

    def prepare(model: Any) -> None:
        torch = require("torch", purpose="tracing a layer recipe")
        parent_path, _, name = layout.layers_path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        layers = getattr(parent, name)
        subset = torch.nn.ModuleList([layers[i] for i in chosen])
        setattr(parent, name, subset)
        kept.append(subset)

    return prepare


@dataclass(frozen=True, kw_only=True)
class _Regions:
    """Module-name tables of the cut model: which subset layer (or head) each module is in."""

    layer_of_module: Any
    """numpy int array over the timeline's module table: subset position, -1 outside, -2 the LM head."""


def _regions(model: Any, subset: Any, timeline: Timeline) -> _Regions:
    root = type(model).__name__
    names = {id(m): f"{root}.{n}" if n else root for n, m in model.named_modules()}
    prefixes = [names[id(layer)] + "." for layer in subset]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings()
    head_prefix = names[id(head)] + "." if head is not None and id(head) in names else None
    table = np.full(len(timeline.modules) + 1, -1, dtype=np.int64)  # last entry: module -1
    for code, module in enumerate(timeline.modules):
        dotted = module + "."
        for position, prefix in enumerate(prefixes):
            if dotted.startswith(prefix):
                table[code] = position
                break
        else:
            if head_prefix is not None and dotted.startswith(head_prefix):
                table[code] = -2
    return _Regions(layer_of_module=table)


@dataclass(frozen=True, kw_only=True)
class _Lifetimes:
    """One row per storage: where and when it was allocated, when freed (events), its size."""

    alloc: Any
    free: Any
    size: Any
    region: Any
    category: Any


def _lifetimes(timeline: Timeline, regions: _Regions) -> _Lifetimes:
    nbytes, storage = timeline.nbytes, timeline.storage
    allocs = np.flatnonzero(nbytes > 0)
    frees = np.flatnonzero(nbytes < 0)
    free_at = dict(zip(storage[frees].tolist(), frees.tolist(), strict=True))
    end = len(timeline)
    free = np.array([free_at.get(s, end) for s in storage[allocs].tolist()], dtype=np.int64)
    module = timeline.module[allocs].astype(np.int64)
    region = regions.layer_of_module[np.where(module >= 0, module, -1)]
    return _Lifetimes(alloc=allocs, free=free, size=nbytes[allocs], region=region, category=timeline.category[allocs])


def _alive(life: _Lifetimes, at: int) -> Any:
    return (life.alloc <= at) & (life.free > at)


def _span(timeline: Timeline, regions: _Regions, position: int, start: int, stop: int) -> tuple[int, int] | None:
    """First and last event of ``[start, stop)`` that ran inside subset layer ``position``."""
    module = timeline.module[start:stop].astype(np.int64)
    inside = np.flatnonzero(regions.layer_of_module[np.where(module >= 0, module, -1)] == position)
    if not len(inside):
        return None
    return start + int(inside[0]), start + int(inside[-1])


def _peak_of(life: _Lifetimes, mask: Any, span: tuple[int, int] | None) -> int:
    """Highest total, over the events of ``span``, of the storages in ``mask`` alive then."""
    if span is None or not mask.any():
        return 0
    first, last = span
    starts = np.clip(life.alloc[mask], first, last + 1)
    stops = np.clip(life.free[mask], first, last + 1)
    keep = starts < stops
    if not keep.any():
        return 0
    points = np.concatenate([starts[keep], stops[keep]])
    deltas = np.concatenate([life.size[mask][keep], -life.size[mask][keep]])
    order = np.lexsort((deltas, points))  # frees before allocations at the same event
    return int(np.cumsum(deltas[order]).max())


def _sum(life: _Lifetimes, mask: Any) -> int:
    return int(life.size[mask].sum())


@dataclass(frozen=True, kw_only=True)
class _TrainingSample:
    kinds: list[tuple[int, int, int, int]]
    outside: tuple[int, int]
    head: int


def _positions_of(layout: GenericLayout, chosen: list[int]) -> list[int]:
    """For each kind, the subset position of the layer measured for it: its second kept layer
    when it has one (what its first keeps beyond that goes outside the layers:
    :func:`_firsts`), else its only one."""
    kept: dict[int, list[int]] = {}
    for position, index in enumerate(chosen):
        kept.setdefault(layout.layer_kinds[index], []).append(position)
    return [kept[kind][1] if len(kept[kind]) > 1 else kept[kind][0] for kind in range(len(layout.kinds))]


def _firsts(layout: GenericLayout, chosen: list[int]) -> list[tuple[int, int]]:
    """(subset position of a kind's first layer, of its measured layer) for kinds measured on
    their second layer."""
    kept: dict[int, list[int]] = {}
    for position, index in enumerate(chosen):
        kept.setdefault(layout.layer_kinds[index], []).append(position)
    return [(positions[0], positions[1]) for positions in kept.values() if len(positions) > 1]


def _training_sample(
    timeline: Timeline,
    regions: _Regions,
    positions: list[int],
    firsts: list[tuple[int, int]],
    fwd_end: int,
    bwd_start: int,
) -> _TrainingSample:
    life = _lifetimes(timeline, regions)
    activation = ~np.isin(life.category, list(_NOT_ACTIVATIONS))
    in_forward = life.alloc < fwd_end
    at_loss, at_backward = _alive(life, fwd_end - 1), _alive(life, bwd_start - 1)
    born_in_backward = (life.alloc >= bwd_start) & (life.category != _GRADIENTS)
    kinds = []
    for position in positions:
        own = (life.region == position) & in_forward & activation
        kept, kept_backward = own & at_loss, own & at_backward
        forward_span = _span(timeline, regions, position, 0, fwd_end)
        backward_span = _span(timeline, regions, position, bwd_start, len(timeline))
        kinds.append(
            (
                _sum(life, kept),
                _sum(life, kept_backward),
                max(0, _peak_of(life, own, forward_span) - _sum(life, kept)),
                max(0, _peak_of(life, kept_backward | born_in_backward, backward_span) - _sum(life, kept_backward)),
            )
        )
    outside = (life.region == -1) & in_forward & activation
    head_start = _first_event(timeline, regions, -2, fwd_end)
    before_head = life.alloc < head_start
    head = (life.alloc >= head_start) & in_forward & activation & at_backward
    # What a kind's first layer keeps beyond its measured (second) layer - tensors made on first
    # use and shared by the layers after it - is outside the layers.
    extra = [0, 0]
    for first, measured in firsts:
        own, other = (
            (life.region == first) & in_forward & activation,
            (life.region == measured) & in_forward & activation,
        )
        extra[0] += _sum(life, own & at_loss) - _sum(life, other & at_loss)
        extra[1] += _sum(life, own & at_backward) - _sum(life, other & at_backward)
    return _TrainingSample(
        kinds=kinds,
        outside=(
            _sum(life, outside & before_head & at_loss) + extra[0],
            _sum(life, outside & before_head & at_backward) + extra[1],
        ),
        head=_sum(life, head),
    )


def _first_event(timeline: Timeline, regions: _Regions, region: int, stop: int) -> int:
    module = timeline.module[:stop].astype(np.int64)
    hits = np.flatnonzero(regions.layer_of_module[np.where(module >= 0, module, -1)] == region)
    return int(hits[0]) if len(hits) else stop


def _traced(spec: Any, attempt: Callable[[list[int], Any], R]) -> R:
    """Run ``attempt`` on fake tensors, with the real code's CUDA paths and a time limit, on the
    cut layer list (:func:`_subset`); if the model's code does not run on a cut list (a forward
    that indexes per-layer config lists by position, Zamba), on every layer. A failure inside
    the model's code becomes one line that names the model: no recipe, so no estimate."""
    require("transformers", purpose="tracing a layer recipe")
    from torch._subclasses.fake_tensor import FakeTensorMode

    layout = spec.generic
    cut, whole = _subset(layout), list(range(layout.num_layers))
    try:
        with real_code_paths(), deadline(DEFAULT_TIMEOUT_S):
            try:
                return attempt(cut, FakeTensorMode(allow_non_fake_inputs=True))
            except VramlensError:
                raise
            except Exception:
                if cut == whole:
                    raise
                return attempt(whole, FakeTensorMode(allow_non_fake_inputs=True))
    except VramlensError:
        raise
    except Exception as error:  # foreign model code
        message = failure_message("model", f"{spec.name} ({spec.model_type})", error, advice="no estimate without it")
        raise SimulationError(message.replace("cannot simulate", "cannot trace the layer recipe of", 1)) from None


def _fits(seq: int, values: list[int]) -> Fit:
    """The fit through the first five ``values`` (measured at :func:`fit_sizes` of ``seq``); the
    seventh, if any, was measured for one sequence of ``seq`` tokens (see :func:`_sizes`)."""
    return solve_fit(seq, tuple(values[:5]), batch_one=values[6] if len(values) > 6 else None)


def _sizes(seq: int) -> list[tuple[int, int]]:
    """The fit's five sizes and the check's (one sequence, between the shortest and longest length).
    When the check misses, one sequence of ``seq`` tokens is measured too (:func:`_measured`)."""
    return [*fit_sizes(seq), check_size(seq)]


def _measured(run: Callable[[int, int], Any], seq: int, samples: list[Any], fitted: Callable[[], bool]) -> None:
    """When ``fitted()`` says the check missed (the fit does not hold down to one sequence, or
    between lengths), add a sample of one sequence of ``seq`` tokens, kept exactly by the fits."""
    if not fitted():
        samples.append(run(1, seq))


def _close(fit: Fit, batch: int, seq: int, measured: int) -> bool:
    predicted = fit.at(batch, seq)
    return abs(predicted - measured) <= RECIPE_TOLERANCE * max(measured, 1) + 4096


@dataclass(frozen=True, kw_only=True)
class _Weights:
    trainable: list[int]
    frozen: list[int]
    trainable_outside: int
    frozen_outside: int


def _weights(model: Any, subset: Any, positions: list[int]) -> _Weights:
    """Trainable elements and frozen bytes (parameters and buffers) of one layer of each kind, as
    the built model holds them, and of everything outside the layers (in eval mode, for
    inference, every parameter is a frozen weight)."""

    training = model.training

    def split(module: Any) -> tuple[int, int]:
        trainable = sum(p.numel() for p in module.parameters() if p.requires_grad) if training else 0
        frozen = sum(p.numel() * p.element_size() for p in module.parameters() if not (training and p.requires_grad))
        frozen += sum(b.numel() * b.element_size() for b in module.buffers())
        return trainable, frozen

    per_layer = [split(layer) for layer in subset]
    total_trainable, total_frozen = split(model)
    return _Weights(
        trainable=[per_layer[p][0] for p in positions],
        frozen=[per_layer[p][1] for p in positions],
        trainable_outside=total_trainable - sum(t for t, _ in per_layer),
        frozen_outside=total_frozen - sum(f for _, f in per_layer),
    )
