"""Trace layer recipes from the real code: a few layers of the model on fake tensors.

For a model described from its code (``spec.generic``), the analytic engine needs, per
kind of decoder layer, what the layer allocates in a training step or in ``generate()``.
This module measures it: the model is built by the simulator's builder (LoRA, NF4 and
dtypes as the workload asks) with its decoder layer list cut down to the first layer of
each kind (and one more, :func:`_subset`), in their order; a training micro-step (or a prefill and a decode step) runs
under the :class:`~vramlens.trace.tracker.MemoryTracker` at the four sizes of
:func:`~vramlens.model.generic.recipe.fit_sizes`; every storage is attributed to the layer
(or the region outside the layers) whose module allocated it; and each quantity is fitted
(:func:`~vramlens.model.generic.recipe.solve_fit`) and checked at a fifth size.

Attribution: a storage belongs to the module running when it was allocated, so a layer's
output, kept by the next layer's norm (fp32 runs), is its own, whatever follows it; what the
first layer reads (the embedding output) is outside the layers. A kind's quantities come
from its first layer in the cut model, which is never the last one kept (see :func:`_subset`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from vramlens._extras import require
from vramlens.categories import Category
from vramlens.errors import VramlensError
from vramlens.estimate.context import TrainingContext
from vramlens.estimate.infer.context import InferenceContext
from vramlens.model.generic.layout import GenericLayout
from vramlens.model.generic.recipe import (
    RECIPE_TOLERANCE,
    Fit,
    InferenceKind,
    InferenceRecipe,
    TrainingKind,
    TrainingRecipe,
    check_size,
    fit_sizes,
    solve_fit,
)
from vramlens.simulate._guard import DEFAULT_TIMEOUT_S, deadline, failure_message
from vramlens.simulate.build import SimulationError, build_model, real_code_paths, torch_dtype
from vramlens.trace.timeline import CATEGORY_ORDER, Timeline

__all__ = ["derive_inference", "derive_training"]

R = TypeVar("R")

_NOT_ACTIVATIONS = {
    CATEGORY_ORDER.index(c)
    for c in (Category.PARAMETERS, Category.BUFFERS, Category.INPUTS, Category.GRADIENTS, Category.OPTIMIZER_STATE)
}
_GRADIENTS = CATEGORY_ORDER.index(Category.GRADIENTS)


def _subset(layout: GenericLayout) -> list[int]:
    """The decoder layers kept, in model order: the first of each kind; the second layer of the
    first layer's kind (the model's first layer may make tensors every layer shares, such as
    masks built on first use: see :func:`_positions_of`); and after the last of those the next
    layer of its kind, so that no kind's measured layer is the last one kept (the last layer's
    backward runs beside the LM head's leftovers)."""
    kinds = layout.layer_kinds
    firsts: dict[int, int] = {}
    for index, kind in enumerate(kinds):
        firsts.setdefault(kind, index)
    chosen = set(firsts.values())
    chosen.update([i for i in range(1, layout.num_layers) if kinds[i] == kinds[0]][:1])
    last = max(chosen)
    chosen.update([i for i in range(last + 1, layout.num_layers) if kinds[i] == kinds[last]][:1])
    return sorted(chosen)


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
    """For each kind, the subset position of the layer measured for it: its first kept layer,
    but for the model's first layer's kind its second one when there is one (the first layer's
    extra, shared tensors go outside the layers: :func:`_training_sample`)."""
    kept: dict[int, list[int]] = {}
    for position, index in enumerate(chosen):
        kept.setdefault(layout.layer_kinds[index], []).append(position)
    first_kind = layout.layer_kinds[chosen[0]]
    return [
        kept[kind][1] if kind == first_kind and len(kept[kind]) > 1 else kept[kind][0]
        for kind in range(len(layout.kinds))
    ]


def _training_sample(
    timeline: Timeline, regions: _Regions, positions: list[int], first_kind: int, fwd_end: int, bwd_start: int
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
    # The model's first layer (subset position 0) is measured for its kind only when it is the
    # kind's one layer; otherwise what it keeps beyond the kind's measured layer (tensors made on
    # first use and shared by every layer) is outside the layers.
    extra = (0, 0)
    if positions[first_kind] != 0:
        first = (life.region == 0) & in_forward & activation
        extra = (
            _sum(life, first & at_loss) - kinds[first_kind][0],
            _sum(life, first & at_backward) - kinds[first_kind][1],
        )
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


def derive_training(ctx: TrainingContext) -> TrainingRecipe:
    """Measure the training recipe of ``ctx`` (its spec must be described from its code)."""
    from vramlens.simulate.train import _recompute

    torch = require("torch", purpose="tracing a layer recipe")
    spec, workload = ctx.spec, ctx.workload
    layout = spec.generic
    assert layout is not None
    seq = workload.seq

    def attempt(chosen: list[int], fake_mode: Any) -> TrainingRecipe:
        positions = _positions_of(layout, chosen)
        kept: list[Any] = []
        model = build_model(
            spec,
            workload,
            dtype=torch_dtype(workload.precision, ctx.frozen_bytes),
            attention=ctx.attention,
            fake_mode=fake_mode,
            prepare=_truncate(layout, chosen, kept),
        )
        model.train()
        notes = _recompute(model, workload)
        params = [p for p in model.parameters() if p.requires_grad]
        weights = _weights(model, kept[0], positions)

        def run(batch: int, length: int) -> _TrainingSample:
            return _training_step(torch, model, kept[0], ctx, fake_mode, params, positions, batch, length)

        samples = [run(batch, length) for batch, length in _sizes(seq)]
        _measured(run, seq, samples, lambda: _training_recipe(samples, seq, weights, notes).interpolates)
        return _training_recipe(samples, seq, weights, notes)

    return _traced(spec, attempt)


def _training_recipe(samples: list[_TrainingSample], seq: int, weights: _Weights, notes: list[str]) -> TrainingRecipe:
    """The recipe through the samples (the sixth is the check; a seventh, one sequence of ``seq``)."""
    kinds = tuple(
        TrainingKind(
            end_of_forward=_fits(seq, [s.kinds[k][0] for s in samples]),
            start_of_backward=_fits(seq, [s.kinds[k][1] for s in samples]),
            forward_transient=_fits(seq, [s.kinds[k][2] for s in samples]),
            backward_working=_fits(seq, [s.kinds[k][3] for s in samples]),
            trainable=weights.trainable[k],
            frozen_bytes=weights.frozen[k],
        )
        for k in range(len(samples[0].kinds))
    )
    outside_forward = _fits(seq, [s.outside[0] for s in samples])
    outside_backward = _fits(seq, [s.outside[1] for s in samples])
    check, (batch, length) = samples[5], check_size(seq)
    interpolates = len(samples) == 6 and all(
        _close(fit, batch, length, measured)
        for kind, values in zip(kinds, check.kinds, strict=True)
        for fit, measured in zip(
            (kind.end_of_forward, kind.start_of_backward, kind.forward_transient, kind.backward_working),
            values,
            strict=True,
        )
    )
    interpolates = interpolates and _close(outside_forward, batch, length, check.outside[0])
    return TrainingRecipe(
        seq=seq,
        interpolates=interpolates,
        kinds=kinds,
        outside_forward=outside_forward,
        outside_backward=outside_backward,
        head_constant=round(_fits(seq, [s.head for s in samples[:5]]).constant),
        trainable_outside=weights.trainable_outside,
        frozen_outside_bytes=weights.frozen_outside,
        notes=tuple(notes),
    )


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


def _training_step(
    torch: Any,
    model: Any,
    subset: Any,
    ctx: TrainingContext,
    fake_mode: Any,
    params: list[Any],
    positions: list[int],
    batch: int,
    seq: int,
) -> _TrainingSample:
    """One forward and backward at ``batch x seq`` under a fresh tracker, attributed to layers."""
    from vramlens.trace.tracker import MemoryTracker

    for parameter in params:
        parameter.grad = None
    tracker = MemoryTracker(clock="event")
    tracker.register_model(model)
    workload = ctx.workload
    try:
        with fake_mode:
            ids = torch.randint(0, ctx.spec.vocab_size, (batch, seq))
            tracker.register(ids, "inputs")
            amp = torch.autocast("cpu", dtype=torch_dtype(workload.precision, 2)) if ctx.autocast else None
            with tracker:
                with amp if amp is not None else contextlib.nullcontext():
                    out = model(input_ids=ids, labels=ids)
                    fwd_end = tracker.event_count
                if amp is not None:
                    out["logits"] = out["logits"].float()
                bwd_start = tracker.event_count
                out.loss.backward()
                del out
    finally:
        tracker.close()
    timeline = tracker.timeline()
    assert ctx.spec.generic is not None
    first_kind = ctx.spec.generic.layer_kinds[0]
    return _training_sample(timeline, _regions(model, subset, timeline), positions, first_kind, fwd_end, bwd_start)


@dataclass(frozen=True, kw_only=True)
class _InferenceSample:
    kinds: list[tuple[int, int]]
    """Per kind: (cache held at the end, peak of the step's other allocations inside the layer)."""
    head: int
    """Peak of the step's allocations (caches aside) at the LM head."""


def derive_inference(ctx: InferenceContext) -> InferenceRecipe:
    """Measure the ``generate()`` recipe of ``ctx`` at its prompt and context lengths."""
    torch = require("torch", purpose="tracing a layer recipe")
    spec = ctx.spec
    layout = spec.generic
    assert layout is not None
    generates = ctx.context > ctx.prompt

    def attempt(chosen: list[int], fake_mode: Any) -> InferenceRecipe:
        positions = _positions_of(layout, chosen)
        kept: list[Any] = []
        model = build_model(
            spec,
            ctx.workload,
            dtype=torch_dtype(ctx.workload.precision, ctx.compute_bytes),
            attention=ctx.attention,
            fake_mode=fake_mode,
            weights=ctx.weights,
            prepare=_truncate(layout, chosen, kept),
        )
        model.eval()
        model.config.use_cache = True
        weights = _weights(model, kept[0], positions)

        def prefill_run(batch: int, length: int) -> _InferenceSample:
            return _generate_step(torch, model, kept[0], fake_mode, positions, spec.vocab_size, batch, length, False)

        def decode_run(batch: int, length: int) -> _InferenceSample:
            return _generate_step(torch, model, kept[0], fake_mode, positions, spec.vocab_size, batch, length, True)

        prefill = [prefill_run(b, n) for b, n in _sizes(ctx.prompt)]
        _measured(prefill_run, ctx.prompt, prefill, lambda: _phase_fits(prefill, ctx.prompt)[1])
        decode = [decode_run(b, n) for b, n in _sizes(ctx.context)] if generates else prefill
        if generates:
            _measured(decode_run, ctx.context, decode, lambda: _phase_fits(decode, ctx.context)[1])
        return _inference_recipe(ctx, prefill, decode, weights)

    return _traced(spec, attempt)


def _inference_recipe(
    ctx: InferenceContext, prefill: list[_InferenceSample], decode: list[_InferenceSample], weights: _Weights
) -> InferenceRecipe:
    """The recipe through the prefill and decode samples (the same when nothing is generated)."""
    generates = ctx.context > ctx.prompt
    prefill_fits, prefill_holds = _phase_fits(prefill, ctx.prompt)
    decode_fits, decode_holds = _phase_fits(decode, ctx.context if generates else ctx.prompt)
    kinds = tuple(
        InferenceKind(
            prefill_cache=prefill_fits[k][0],
            prefill_working=prefill_fits[k][1],
            decode_cache=decode_fits[k][0],
            decode_working=decode_fits[k][1],
            weight_bytes=weights.frozen[k],
        )
        for k in range(len(prefill_fits))
    )
    return InferenceRecipe(
        prompt=ctx.prompt,
        context=ctx.context,
        interpolates=prefill_holds and decode_holds,
        kinds=kinds,
        head_prefill=_fits(ctx.prompt, [s.head for s in prefill]),
        head_decode=_fits(ctx.context if generates else ctx.prompt, [s.head for s in decode]),
        weight_outside_bytes=weights.frozen_outside,
    )


def _phase_fits(samples: list[_InferenceSample], seq: int) -> tuple[list[tuple[Fit, Fit]], bool]:
    """Per kind, (cache, working) fits through the samples, and whether the check held."""
    fits = [
        (_fits(seq, [s.kinds[k][0] for s in samples]), _fits(seq, [s.kinds[k][1] for s in samples]))
        for k in range(len(samples[0].kinds))
    ]
    batch, length = check_size(seq)
    holds = len(samples) == 6 and all(
        _close(cache, batch, length, values[0]) and _close(working, batch, length, values[1])
        for (cache, working), values in zip(fits, samples[5].kinds, strict=True)
    )
    return fits, holds


def _generate_step(
    torch: Any,
    model: Any,
    subset: Any,
    fake_mode: Any,
    positions: list[int],
    vocab: int,
    batch: int,
    seq: int,
    decode: bool,
) -> _InferenceSample:
    """A prefill of ``seq`` tokens, or (``decode``) a prefill of ``seq - 1`` and the decode step
    that brings the context to ``seq``, as ``generate()`` runs them, under a fresh tracker."""
    from vramlens.trace.tracker import MemoryTracker

    step = _generation_step(model)

    tracker = MemoryTracker(clock="event")
    tracker.register_model(model)
    try:
        with fake_mode, torch.no_grad():
            ids = torch.randint(0, vocab, (batch, seq))
            tracker.register(ids, Category.INPUTS)
            with tracker:
                cache = None
                if decode and seq > 1:
                    cache = step(torch, ids[:, : seq - 1], None, tracker, 0)
                before = tracker.event_count
                if decode and seq > 1:
                    cache = step(torch, ids[:, seq - 1 :], cache, tracker, seq - 1)
                else:
                    cache = step(torch, ids, None, tracker, 0)
                end = tracker.event_count
                del cache
    finally:
        tracker.close()
    timeline = tracker.timeline()
    return _inference_sample(timeline, _regions(model, subset, timeline), positions, before, end)


def _generation_step(model: Any) -> Callable[[Any, Any, Any, Any, int], Any]:
    """One forward as ``generate()`` runs it, for the model's own signature: the cache passed as
    ``past_key_values`` (or ``cache_params``, Mamba), position ids per sequence and
    ``logits_to_keep=1`` where the model takes them; the last position's logits are copied to
    float32 and argmax'd; the cache is returned, its tensors labelled ``kv_cache``."""
    import inspect

    accepted = set(inspect.signature(model.forward).parameters)
    cache_key = "past_key_values" if "past_key_values" in accepted else "cache_params"

    def step(torch: Any, ids: Any, cache: Any, tracker: Any, start: int) -> Any:
        batch, length = ids.shape
        kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": True}
        if cache is not None:
            kwargs[cache_key] = cache
        if "position_ids" in accepted:
            kwargs["position_ids"] = torch.arange(start, start + length).unsqueeze(0).expand(batch, -1)
        if "cache_position" in accepted:
            kwargs["cache_position"] = torch.arange(start, start + length)
        if "logits_to_keep" in accepted:
            kwargs["logits_to_keep"] = 1
        out = model(**kwargs)
        logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
        cache = getattr(out, cache_key, None)
        del out
        logits.argmax(dim=-1)
        tracker.set_category(_tensors_in(torch, cache), Category.KV_CACHE)
        return cache

    return step


def _tensors_in(torch: Any, value: Any, depth: int = 0) -> list[Any]:
    """Every tensor reachable from a cache object (its attributes, lists and dicts, 4 levels deep)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth >= 4 or value is None or isinstance(value, (str, int, float, bool)):
        return []
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    elif hasattr(value, "__dict__"):
        items = list(vars(value).values())
    else:
        return []
    return [tensor for item in items for tensor in _tensors_in(torch, item, depth + 1)]


def _inference_sample(
    timeline: Timeline, regions: _Regions, positions: list[int], before: int, end: int
) -> _InferenceSample:
    """Per kind: the cache its layer holds when the step ends, and the step's peak inside the
    layer above the end state (see :func:`_excess`)."""
    life = _lifetimes(timeline, regions)
    last = end - 1
    live = timeline.live_bytes
    kinds = []
    for position in positions:
        held = (life.region == position) & _alive(life, last) & ~np.isin(life.category, list(_NOT_ACTIVATIONS))
        span = _span(timeline, regions, position, before, end)
        kinds.append((_sum(life, held), _excess(life, live, span, position, before, last)))
    head = _span(timeline, regions, -2, before, end)
    return _InferenceSample(kinds=kinds, head=_excess(life, live, head, -2, before, last))


def _excess(life: _Lifetimes, live: Any, span: tuple[int, int] | None, region: int, before: int, last: int) -> int:
    """Highest live total over ``span`` above the step's end state, as seen from that instant.

    At an event ``t`` inside a layer, the layers after it have not yet made their new caches
    (allocated after ``t``, alive at the end) and still hold their old ones (allocated before
    the step, freed after ``t``): the end state seen from ``t`` counts the new ones as absent
    and the old ones of other layers as present; the layer's own old cache, still alive while
    it is concatenated with the new entries, is part of its peak.
    """
    if span is None:
        return 0
    first, final = span
    events = np.arange(first, final + 1)
    at_end = _alive(life, last)
    new_alloc = np.sort(life.alloc[at_end])
    new_size = life.size[at_end][np.argsort(life.alloc[at_end])]
    suffix = np.concatenate([np.cumsum(new_size[::-1])[::-1], [0]])
    made_later = suffix[np.searchsorted(new_alloc, events, side="right")]
    old = (life.alloc < before) & (life.free > first) & (life.free <= last) & (life.region != region)
    old_alloc, old_free, old_size = life.alloc[old], life.free[old], life.size[old]
    order = np.argsort(old_free)
    old_suffix = np.concatenate([np.cumsum(old_size[order][::-1])[::-1], [0]])
    freed_later = old_suffix[np.searchsorted(old_free[order], events, side="right")]
    del old_alloc
    level = int(live[last]) - made_later + freed_later
    return max(0, int((live[first : final + 1] - level).max()))
