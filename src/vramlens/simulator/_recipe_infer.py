"""Trace the ``generate()`` recipe of a model described from its code: a prefill and a decode
step of the cut model on fake tensors (see :mod:`vramlens.simulator.recipe`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vramlens._extras import require
from vramlens.categories import Category
from vramlens.estimator.infer.context import InferenceContext
from vramlens.model.generic.recipe import (
    Fit,
    InferenceKind,
    InferenceRecipe,
    check_size,
)
from vramlens.result.timeline import Timeline
from vramlens.simulator._recipe_trace import (
    _NOT_ACTIVATIONS,
    _alive,
    _close,
    _fits,
    _Lifetimes,
    _lifetimes,
    _measured,
    _positions_of,
    _Regions,
    _regions,
    _sizes,
    _span,
    _sum,
    _traced,
    _truncate,
    _Weights,
    _weights,
)
from vramlens.simulator.build import build_model, torch_dtype


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
