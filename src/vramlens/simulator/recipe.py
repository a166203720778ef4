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
from typing import Any

from vramlens._extras import require
from vramlens.model.generic.recipe import (
    TrainingKind,
    TrainingRecipe,
    check_size,
)
from vramlens.resolve.context import TrainingContext
from vramlens.simulator._recipe_infer import derive_inference
from vramlens.simulator._recipe_trace import (
    _close,
    _firsts,
    _fits,
    _measured,
    _positions_of,
    _regions,
    _sizes,
    _traced,
    _training_sample,
    _TrainingSample,
    _truncate,
    _Weights,
    _weights,
)
from vramlens.simulator.build import build_model, torch_dtype

__all__ = ["derive_inference", "derive_training"]


def derive_training(ctx: TrainingContext) -> TrainingRecipe:
    """Measure the training recipe of ``ctx`` (its spec must be described from its code)."""
    from vramlens.simulator.train import _recompute

    torch = require("torch", purpose="tracing a layer recipe")
    spec, workload = ctx.spec, ctx.workload
    layout = spec.generic
    assert layout is not None
    seq = workload.seq

    def attempt(chosen: list[int], fake_mode: Any) -> TrainingRecipe:
        positions, firsts = _positions_of(layout, chosen), _firsts(layout, chosen)
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
            return _training_step(torch, model, kept[0], ctx, fake_mode, params, (positions, firsts), batch, length)

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


def _training_step(
    torch: Any,
    model: Any,
    subset: Any,
    ctx: TrainingContext,
    fake_mode: Any,
    params: list[Any],
    measured: tuple[list[int], list[tuple[int, int]]],
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
    positions, firsts = measured
    return _training_sample(timeline, _regions(model, subset, timeline), positions, firsts, fwd_end, bwd_start)
