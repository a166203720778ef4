"""Run one configuration of an experiment for real and measure it.

A run trains the model (transformers from a config with random weights, or a user's module)
for ``steps`` optimizer steps on the run's device:

* step 1 is the warm-up (optimizer state appears; a compiled model compiles);
* on CPU, steps 2 .. N-1 are timed and step N is measured: the tracker's allocated-level peak
  (:func:`vramlens.track`: every storage operators return, to the byte), or for compiled
  code the CPU allocator's own events (the profiler's ``[memory]`` records) over the bytes
  alive before the step, because a dispatch-mode tracker runs compiled graphs eagerly
  (``docs/research/torch-cpu-probes.md`` section 7);
* on CUDA, steps 2 .. N are timed and measured together: ``max_memory_allocated`` and
  ``max_memory_reserved`` after ``reset_peak_memory_stats`` at the end of the warm-up.

tokens/s is ``batch x seq`` over the median timed step's wall time; the loss is the last step's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from vramlens._extras import require
from vramlens.experiments._training import Trainee, batches, build_trainee, compile_settings
from vramlens.experiments.matrix import RunSpec
from vramlens.experiments.techniques import unavailable_reason

__all__ = ["RunResult", "allocator_peak", "run_experiment", "tracked_peak"]

#: Progress callback: (steps done, steps in all).
OnStep = Callable[[int, int], None]


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """What one run measured (or why it was skipped)."""

    key: str
    name: str
    techniques: tuple[str, ...]
    device: str
    measured_peak_bytes: int | None = None
    """Allocated-level peak of the measured step(s), bytes."""
    reserved_peak_bytes: int | None = None
    """CUDA only: ``max_memory_reserved``, bytes."""
    measured_by: str | None = None
    """``tracker`` (CPU), ``allocator`` (CPU, compiled code) or ``cuda``."""
    measured_breakdown: dict[str, int] | None = None
    """Tracker only: bytes per category (parameters, activations, ...) at the peak."""
    tokens_per_s: float | None = None
    step_seconds: float | None = None
    """Median wall time of the timed steps."""
    loss: float | None = None
    losses: tuple[float, ...] = ()
    skipped: str | None = None
    notes: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe."""
        out = asdict(self)
        out["techniques"] = list(self.techniques)
        out["losses"] = list(self.losses)
        out["notes"] = list(self.notes)
        return out


def run_experiment(spec: RunSpec, *, on_step: OnStep | None = None) -> RunResult:
    """Train ``spec`` for its steps and measure it; a run whose technique cannot run on this
    machine (a missing package, a CUDA out-of-memory) comes back with ``skipped`` set."""
    base: dict[str, Any] = {
        "key": spec.key,
        "name": spec.name,
        "techniques": tuple(a.label for a in spec.techniques),
        "device": spec.device,
        "config": spec.config(),
        "workload": _plain_workload(spec),
    }
    reason = unavailable_reason(spec.techniques)
    if reason is not None:
        return RunResult(**base, skipped=reason)
    torch = require("torch", purpose="vramlens experiment")
    try:
        with compile_settings(spec):
            measured = _train(spec, on_step or (lambda done, total: None))
    except torch.OutOfMemoryError:
        return RunResult(**base, skipped=f"{spec.device}: out of memory")
    return RunResult(**base, **measured)


def _plain_workload(spec: RunSpec) -> dict[str, Any] | None:
    """The run's workload with the model as the user gave it (a config dict stays a dict)."""
    workload = spec.workload()
    if workload is not None:
        workload["model"] = spec.model if isinstance(spec.model, str) else dict(spec.model)
    return workload


def _train(spec: RunSpec, on_step: OnStep) -> dict[str, Any]:
    trainee = build_trainee(spec)
    data = batches(spec, trainee.vocab_size)
    cuda = spec.device.startswith("cuda")
    losses = [trainee.step(data[0])]  # warm-up
    on_step(1, spec.steps)
    if cuda:
        measured, timed = _cuda_steps(spec, trainee, data, losses, on_step)
    else:
        timed = _timed_steps(trainee, data[1:-1], losses, on_step, done=1, total=spec.steps)
        if spec.compiled:
            peak, loss = allocator_peak(trainee, data[-1])
            measured = {"measured_peak_bytes": peak, "measured_by": "allocator"}
        else:
            peak, breakdown, loss = tracked_peak(trainee, data[-1])
            measured = {"measured_peak_bytes": peak, "measured_by": "tracker", "measured_breakdown": breakdown}
        losses.append(loss)
        on_step(spec.steps, spec.steps)
    step_seconds = statistics.median(timed)  # robust to a step slowed by another process
    return measured | {
        "tokens_per_s": spec.batch * spec.seq / step_seconds,
        "step_seconds": step_seconds,
        "loss": losses[-1],
        "losses": tuple(losses),
        "notes": tuple(trainee.notes),
    }


def _timed_steps(trainee: Trainee, data: list[Any], losses: list[float], on_step: OnStep, *, done: int,
                 total: int, sync: Callable[[], None] | None = None) -> list[float]:  # fmt: skip
    """Run and time one step per batch of ``data``; returns each step's seconds."""
    seconds = []
    for index, ids in enumerate(data, start=done + 1):
        start = time.perf_counter()
        losses.append(trainee.step(ids))
        if sync is not None:
            sync()
        seconds.append(time.perf_counter() - start)
        on_step(index, total)
    return seconds


def _cuda_steps(
    spec: RunSpec, trainee: Trainee, data: list[Any], losses: list[float], on_step: OnStep
) -> tuple[dict[str, Any], list[float]]:
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    timed = _timed_steps(trainee, data[1:], losses, on_step, done=1, total=spec.steps, sync=torch.cuda.synchronize)
    measured = {
        "measured_peak_bytes": int(torch.cuda.max_memory_allocated()),
        "reserved_peak_bytes": int(torch.cuda.max_memory_reserved()),
        "measured_by": "cuda",
    }
    return measured, timed


def _registered(trainee: Trainee, ids: Any) -> list[Any]:
    """What exists before a step: parameters, buffers, gradients, optimizer state, the batch."""
    from vramlens.trace._context import optimizer_state_tensors

    model = trainee.model
    tensors = [*model.parameters(), *model.buffers(), ids]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for optimizer in trainee.optimizers:
        tensors += optimizer_state_tensors(optimizer)
    return tensors


def tracked_peak(trainee: Trainee, ids: Any) -> tuple[int, dict[str, int], float]:
    """One step under the tracker: its allocated-level peak (bytes), the bytes per category at
    the peak, and the loss."""
    from vramlens.categories import Category
    from vramlens.trace._context import optimizer_state_tensors
    from vramlens.trace.tracker import track

    with track(trainee.model, None, ids) as tracker:
        for optimizer in trainee.optimizers:
            tracker.register(optimizer_state_tensors(optimizer), Category.OPTIMIZER_STATE)
        loss = trainee.step(ids)
    timeline = tracker.timeline()
    breakdown = {category.value: int(value) for category, value in timeline.breakdown_at().items()}
    return timeline.peak_bytes, breakdown, loss


def allocator_peak(trainee: Trainee, ids: Any) -> tuple[int, float]:
    """One step under the CPU allocator's recorder: the bytes alive before it (each storage
    once) plus the highest running total of the allocator's calls during it, and the loss."""
    from vramlens.trace._allocator import AllocatorRecorder

    seen: dict[int, int] = {}
    for tensor in _registered(trainee, ids):
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    recorder = AllocatorRecorder()
    recorder.start()
    try:
        loss = trainee.step(ids)
    finally:
        recorder.stop()
    running = highest = 0
    for event in recorder.events:
        running += event.nbytes
        highest = max(highest, running)
    return sum(seen.values()) + highest, loss
