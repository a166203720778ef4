"""Simulated training steps: forward, loss, backward and optimizer step of the real model on fake tensors.

The step is what HF Trainer (transformers + accelerate + PEFT) runs: the model computes
its loss from ``labels`` (fp32-upcast cross-entropy), under autocast for mixed precision
with the kept logits converted to fp32 (accelerate's ``convert_outputs_to_fp32``), then
``loss.backward()``, ``optimizer.step()`` and ``zero_grad(set_to_none=True)``. Gradient
accumulation runs ``grad_accum`` forward/backward micro-steps per optimizer step. Several
steps run (the first creates the optimizer state) and the report reads the last one.
Several GPUs run as FSDP2 on a fake process group, rank 0 reported
(:mod:`vramlens.simulator.distributed`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

from vramlens._extras import require
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.kbit import BNB_4BIT_QUANTS
from vramlens.result.timeline import Timeline
from vramlens.simulator.build import SimulationError, attention_note, build_model, torch_dtype
from vramlens.simulator.distributed import (
    ShardPlan,
    check_sharding,
    fake_process_group,
    fsdp_categories,
    fsdp_streams,
    gradient_sync,
    shard_model,
    shard_plan,
)
from vramlens.simulator.quant import quant_note
from vramlens.workload.options import OptimizerImpl, OptimizerName, Quant, Recompute

__all__ = ["TrainingRun", "simulate_training"]


@dataclass(frozen=True, kw_only=True)
class TrainingRun:
    """The events of a simulated run and where its last step begins."""

    timeline: Timeline
    last_step_start: int
    """Index of the first event of the last (measured) optimizer step."""
    notes: tuple[str, ...]
    backward_blas_event: int = -1
    """Index at which the backward thread's cuBLAS workspace is allocated (:mod:`vramlens.simulator._blas`;
    -1: no backward ran a cuBLAS operator)."""


def _adamw(torch: Any, params: list[Any], impl: OptimizerImpl) -> Any:
    flags = {OptimizerImpl.FUSED: {"fused": True}, OptimizerImpl.FOREACH: {"foreach": True}}
    return torch.optim.AdamW(params, lr=1e-4, **flags.get(impl, {"foreach": False}))


def _sgd(torch: Any, params: list[Any], impl: OptimizerImpl) -> Any:
    flags = {OptimizerImpl.FUSED: {"fused": True}, OptimizerImpl.FOREACH: {"foreach": True}}
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **flags.get(impl, {"foreach": False}))


def _adafactor(torch: Any, params: list[Any], impl: OptimizerImpl) -> Any:
    optimizer = torch.optim.Adafactor(params, lr=1e-2, foreach=impl is OptimizerImpl.FOREACH)
    step = optimizer.step  # the class's step: the tracker's global optimizer hooks run inside it

    def step_reading_values(*args: Any, **kwargs: Any) -> Any:
        with _scalar_reads(torch):
            return step(*args, **kwargs)

    optimizer.step = step_reading_values
    return optimizer


@contextlib.contextmanager
def _scalar_reads(torch: Any) -> Iterator[None]:
    """Let ``.item()`` on a fake tensor read 1 inside the block.

    torch's Adafactor reads its step count and each parameter's norm as Python numbers
    (``step_t.item()``, ``param.norm(2).item()``) to compute its step size; fake tensors
    have no values, so the read would stop the simulation. The value changes the update,
    never which tensors are made, so memory is unaffected.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    original = torch.Tensor.item

    def item(tensor: Any) -> Any:
        if isinstance(tensor, FakeTensor):
            return 1.0 if tensor.is_floating_point() else 1
        return original(tensor)

    with mock.patch.object(torch.Tensor, "item", item):
        yield


#: Optimizers the simulator can run (torch's own implementations); a new one is an entry here.
OPTIMIZERS: dict[OptimizerName, Callable[[Any, list[Any], OptimizerImpl], Any]] = {
    OptimizerName.ADAMW: _adamw,
    OptimizerName.SGD: _sgd,
    OptimizerName.ADAFACTOR: _adafactor,
}


def check_training(ctx: TrainingContext) -> None:
    """Refuse, with a message that names the key, what the simulator cannot run."""
    workload = ctx.workload
    parallel = workload.parallel
    refusals = {
        "parallel": (parallel.tp, parallel.pp, parallel.cp, parallel.ep) != (1, 1, 1, 1),
        "quant": workload.quant is not Quant.NONE and workload.quant not in BNB_4BIT_QUANTS,
        "compile": workload.compile,
        "optimizer": workload.optimizer not in OPTIMIZERS,
        "kernels": workload.kernels.value != "eager",
        "loss": ctx.loss.value != "full",
        "recompute": workload.recompute in (Recompute.SELECTIVE, Recompute.OFFLOAD),
        "framework": ctx.profile.name.value not in ("hf",),
        "method": workload.method.value == "freeze",
        "float8": workload.float8,
    }
    for key, refused in refusals.items():
        if refused:
            value = getattr(workload, key, None) if key != "parallel" else parallel
            raise SimulationError(
                f"{key}: the simulator runs transformers training (HF Trainer's step; several GPUs as FSDP2) and "
                f"cannot run {_describe(key, value)}; use `vramlens estimate` for this workload"
            )
    check_sharding(ctx)


def _describe(key: str, value: Any) -> str:
    if key == "parallel":
        return f"tp={value.tp} pp={value.pp} cp={value.cp} ep={value.ep}"
    return f"{key}={value}"


def simulate_training(
    ctx: TrainingContext, *, steps: int, fake_mode: Any, tracker: Any, replay: bool = True
) -> TrainingRun:
    """Run ``steps`` optimizer steps of the workload under ``tracker`` and return the events.
    On several GPUs the model is sharded with FSDP2 over a fake process group that exists for
    this call only, and the events are rank 0's (:mod:`vramlens.simulator.distributed`).
    With ``replay`` (one GPU), repeated decoder layers run once and their events are replayed
    for the layers like them (:mod:`vramlens.simulator._replay`), with the same events as
    running every layer; where that cannot be done exactly, every layer runs."""
    check_training(ctx)
    plan = shard_plan(ctx)
    with fake_process_group(plan):
        if replay and plan is None:  # FSDP2: replayed runs equal executed ones alone, not after other runs
            run = _replayed(ctx, plan, steps=steps, fake_mode=fake_mode, capture_stacks=tracker.capture_stacks)
            if run is not None:
                return run
        return _simulate(ctx, plan, steps=steps, fake_mode=fake_mode, tracker=tracker)


def _replayed(
    ctx: TrainingContext, plan: ShardPlan | None, *, steps: int, fake_mode: Any, capture_stacks: bool
) -> TrainingRun | None:
    """The run of the cut model expanded to the full one, or None when it cannot be exact."""
    from vramlens.simulator._labels import LabelTracker
    from vramlens.simulator._layers import LayerCut
    from vramlens.simulator._replay import Unresolved, expand

    frozen_input = ctx.workload.method.value != "full"
    for skip in (0, 1):  # the second time, the region starts a unit later (its first unit was unlike)
        cut = LayerCut(frozen_input=frozen_input, skip_units=skip)
        tracker = LabelTracker(cut, capture_stacks=capture_stacks)
        try:
            run = _simulate(ctx, plan, steps=steps, fake_mode=fake_mode, tracker=tracker, cut=cut)
        finally:
            tracker.close()
        if cut.region is None:
            return run if not skip else None  # nothing to replay: every layer ran
        try:
            expanded = expand(run.timeline, tracker)
            break
        except Unresolved as refusal:
            if not refusal.retry:
                return None
    else:
        return None
    region = cut.region
    first, last = region.start + 2 * region.period, region.stop - region.period - 1
    template = f"layer {first - 1}" if region.period == 1 else f"layers {region.start + region.period}-{first - 1}"
    note = (
        f"decoder layers {first}-{last} ({last - first + 1} of {cut.total}) replayed from the recorded events of "
        f"{template}, built alike (replay=False runs every layer)"
    )
    start = int(expanded.new_index[run.last_step_start]) if run.last_step_start < len(run.timeline) else 0
    blas = run.backward_blas_event
    blas = int(expanded.new_index[blas - 1]) + 1 if blas > 0 else blas  # right after the same operator's output
    return TrainingRun(
        timeline=expanded.timeline, last_step_start=start, notes=(*run.notes, note), backward_blas_event=blas
    )


def _simulate(
    ctx: TrainingContext, plan: ShardPlan | None, *, steps: int, fake_mode: Any, tracker: Any, cut: Any = None
) -> TrainingRun:
    """The body of :func:`simulate_training` (inside the process group when ``plan`` is set);
    ``cut`` (a :class:`~vramlens.simulator._layers.LayerCut`) builds the model cut to its region."""
    torch = require("torch", purpose="vramlens simulate")
    from vramlens.simulator._blas import BackwardBlasWatch

    workload = ctx.workload
    dtype = torch_dtype(workload.precision, ctx.frozen_bytes)
    prepare = None
    if cut is not None:
        from vramlens.simulator._layers import cutter

        every = workload.recompute_every if workload.recompute is Recompute.FULL else 1
        layers_path = ctx.spec.generic.layers_path if ctx.spec.generic is not None else None
        prepare = cutter(workload, layers_path, every, cut)
    model = build_model(ctx.spec, workload, dtype=dtype, attention=ctx.attention, fake_mode=fake_mode, prepare=prepare)
    model.train()
    notes = _recompute(model, workload, cut.checkpointed if cut is not None else None)
    notes += [note for note in (attention_note(model), quant_note(model)) if note]
    if plan is not None:
        notes += shard_model(model, plan, fake_mode=fake_mode, total_layers=cut.total if cut and cut.region else None)
    notes.append("the loop keeps the model outputs (logits) through backward (HF Trainer drops them first)")
    params = [p for p in model.parameters() if p.requires_grad]
    tracker.register_model(model)  # before the optimizer's hooks, so gradients are labelled first
    step = _optimizer_step(torch, params, ctx)
    labels = fsdp_categories(tracker) if plan is not None else contextlib.nullcontext()
    streams = fsdp_streams(tracker) if plan is not None else contextlib.nullcontext()
    with fake_mode, labels, streams:
        ids = torch.randint(0, ctx.spec.vocab_size, (workload.batch, workload.seq))
        tracker.register(ids, "inputs")
        amp = torch.autocast("cpu", dtype=torch_dtype(workload.precision, 2)) if ctx.autocast else None
        start = 0
        watch = BackwardBlasWatch(tracker)
        with tracker, watch:
            for _ in range(steps):
                start = tracker.event_count
                for index in range(workload.grad_accum):
                    with gradient_sync(model, plan, last=index == workload.grad_accum - 1):
                        _micro_step(model, ids, amp)
                step()
    return TrainingRun(
        timeline=tracker.timeline(), last_step_start=start, notes=tuple(notes), backward_blas_event=watch.event
    )


def _micro_step(model: Any, ids: Any, amp: Any) -> None:
    """One forward and backward. The model's outputs (the logits) stay alive through
    ``backward``, as in ``out = model(**batch); out.loss.backward()``: the hf profile's
    ``keeps_logits``, which the estimator uses too (HF Trainer's ``compute_loss``, which
    returns the loss alone, frees them first; see FrameworkProfile.keeps_logits)."""
    with amp if amp is not None else contextlib.nullcontext():
        out = model(input_ids=ids, labels=ids)
    if amp is not None:
        out["logits"] = out["logits"].float()  # accelerate's convert_outputs_to_fp32
    out.loss.backward()
    del out


def _recompute(model: Any, workload: Any, checkpointed: dict[int, bool] | None = None) -> list[str]:
    """Turn on the workload's gradient checkpointing; ``checkpointed`` (id(layer) -> flag) gives
    the flags of a cut model's layers as the full model has them (``recompute_every`` > 1)."""
    if workload.recompute is not Recompute.FULL:
        return []
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(model, "enable_input_require_grads") and workload.method.value != "full":
        model.enable_input_require_grads()
    every = workload.recompute_every
    if every == 1:
        return ["recompute full: transformers gradient checkpointing (non-reentrant) on every decoder layer"]
    for index, layer in enumerate(checkpoint_candidates(model)):
        flag = checkpointed.get(id(layer)) if checkpointed else None
        layer.gradient_checkpointing = index % every == 0 if flag is None else flag
    return [f"recompute full every {every}: checkpointing on decoder layers 0, {every}, {2 * every}, ..."]


def checkpoint_candidates(model: Any) -> list[Any]:
    """The layers ``recompute_every`` counts: decoder layers that can checkpoint, in order."""
    return [
        m
        for name, m in model.named_modules()
        if hasattr(m, "gradient_checkpointing")
        and type(m).__name__.endswith("Layer")
        and not any(part in name for part in ("vision", "visual"))  # a multimodal model's tower has its own
    ]


def _optimizer_step(torch: Any, params: list[Any], ctx: TrainingContext) -> Callable[[], None]:
    factory = OPTIMIZERS[ctx.workload.optimizer]
    if not ctx.workload.optimizer_in_backward:
        optimizer = factory(torch, params, ctx.optimizer_impl)

        def step() -> None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step
    # Optimizer in backward, the PyTorch way: one optimizer per parameter, stepped by a
    # post-accumulate-grad hook, which then frees the gradient.
    per_param = {p: factory(torch, [p], ctx.optimizer_impl) for p in params}

    def hook(parameter: Any) -> None:
        per_param[parameter].step()
        per_param[parameter].zero_grad(set_to_none=True)

    for parameter in params:
        parameter.register_post_accumulate_grad_hook(hook)
    return lambda: None
