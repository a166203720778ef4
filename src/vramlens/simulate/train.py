"""Simulated training steps: forward, loss, backward and optimizer step of the real model on fake tensors.

The step is what HF Trainer (transformers + accelerate + PEFT) runs: the model computes
its loss from ``labels`` (fp32-upcast cross-entropy), under autocast for mixed precision
with the kept logits converted to fp32 (accelerate's ``convert_outputs_to_fp32``), then
``loss.backward()``, ``optimizer.step()`` and ``zero_grad(set_to_none=True)``. Gradient
accumulation runs ``grad_accum`` forward/backward micro-steps per optimizer step. Several
steps run (the first creates the optimizer state) and the report reads the last one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vramlens._extras import require
from vramlens.estimate.context import TrainingContext
from vramlens.simulate.build import SimulationError, attention_note, build_model, torch_dtype
from vramlens.trace.timeline import Timeline
from vramlens.workload.options import OptimizerImpl, OptimizerName, Recompute

__all__ = ["TrainingRun", "simulate_training"]


@dataclass(frozen=True, kw_only=True)
class TrainingRun:
    """The events of a simulated run and where its last step begins."""

    timeline: Timeline
    last_step_start: int
    """Index of the first event of the last (measured) optimizer step."""
    notes: tuple[str, ...]


def _adamw(torch: Any, params: list[Any], impl: OptimizerImpl) -> Any:
    flags = {OptimizerImpl.FUSED: {"fused": True}, OptimizerImpl.FOREACH: {"foreach": True}}
    return torch.optim.AdamW(params, lr=1e-4, **flags.get(impl, {"foreach": False}))


def _sgd(torch: Any, params: list[Any], impl: OptimizerImpl) -> Any:
    flags = {OptimizerImpl.FUSED: {"fused": True}, OptimizerImpl.FOREACH: {"foreach": True}}
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **flags.get(impl, {"foreach": False}))


def _adafactor(torch: Any, params: list[Any], impl: OptimizerImpl) -> Any:
    return torch.optim.Adafactor(params, lr=1e-2, foreach=impl is OptimizerImpl.FOREACH)


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
        "gpus": parallel.gpus > 1,
        "quant": workload.quant.value != "none" or workload.method.value == "qlora",
        "compile": workload.compile,
        "optimizer": workload.optimizer not in OPTIMIZERS,
        "loss": ctx.loss.value != "full",
        "recompute": workload.recompute in (Recompute.SELECTIVE, Recompute.OFFLOAD),
        "framework": ctx.profile.name.value not in ("hf",),
        "method": workload.method.value == "freeze",
        "float8": workload.float8,
    }
    for key, refused in refusals.items():
        if refused:
            value = getattr(workload, key, None) if key not in ("parallel", "gpus") else parallel
            raise SimulationError(
                f"{key}: the simulator runs single-GPU transformers training (HF Trainer's step) and cannot run "
                f"{_describe(key, value)}; use `vramlens estimate` for this workload"
            )


def _describe(key: str, value: Any) -> str:
    if key == "parallel":
        return f"tp={value.tp} pp={value.pp} cp={value.cp} ep={value.ep}"
    if key == "gpus":
        return f"{value.gpus} GPUs (sharding is estimated, not simulated)"
    return f"{key}={value}"


def simulate_training(ctx: TrainingContext, *, steps: int, fake_mode: Any, tracker: Any) -> TrainingRun:
    """Run ``steps`` optimizer steps of the workload under ``tracker`` and return the events."""
    torch = require("torch", purpose="vramlens simulate")
    check_training(ctx)
    workload = ctx.workload
    dtype = torch_dtype(workload.precision, ctx.frozen_bytes)
    model = build_model(ctx.spec, workload, dtype=dtype, attention=ctx.attention, fake_mode=fake_mode)
    model.train()
    notes = _recompute(model, workload)
    notes += [note for note in (attention_note(model),) if note]
    params = [p for p in model.parameters() if p.requires_grad]
    tracker.register_model(model)  # before the optimizer's hooks, so gradients are labelled first
    step = _optimizer_step(torch, params, ctx)
    with fake_mode:
        ids = torch.randint(0, ctx.spec.vocab_size, (workload.batch, workload.seq))
        tracker.register(ids, "inputs")
        amp = torch.autocast("cpu", dtype=torch_dtype(workload.precision, 2)) if ctx.autocast else None
        start = 0
        with tracker:
            for _ in range(steps):
                start = tracker.event_count
                for _ in range(workload.grad_accum):
                    _micro_step(model, ids, amp)
                step()
    return TrainingRun(timeline=tracker.timeline(), last_step_start=start, notes=tuple(notes))


def _micro_step(model: Any, ids: Any, amp: Any) -> None:
    with amp if amp is not None else contextlib.nullcontext():
        out = model(input_ids=ids, labels=ids)
    if amp is not None:
        out["logits"] = out["logits"].float()
    out.loss.backward()
    del out


def _recompute(model: Any, workload: Any) -> list[str]:
    if workload.recompute is not Recompute.FULL:
        return []
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(model, "enable_input_require_grads") and workload.method.value != "full":
        model.enable_input_require_grads()
    every = workload.recompute_every
    if every == 1:
        return ["recompute full: transformers gradient checkpointing (non-reentrant) on every decoder layer"]
    layers = [m for m in model.modules() if hasattr(m, "gradient_checkpointing") and type(m).__name__.endswith("Layer")]
    for index, layer in enumerate(layers):
        layer.gradient_checkpointing = index % every == 0
    return [f"recompute full every {every}: checkpointing on decoder layers 0, {every}, {2 * every}, ..."]


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
