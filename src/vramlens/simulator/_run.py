"""Running a simulation: fake mode, tracker, the training or inference driver, the report.

Failures inside the model code on fake tensors (data-dependent control flow, operators
without a fake implementation, custom code) become one-line :class:`SimulationError`
messages that suggest ``vramlens estimate``; nothing is retried, and a wall-clock limit
(:func:`~vramlens.simulator._guard.deadline`, ``timeout_s``) stops code that would hang.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from vramlens._extras import require
from vramlens.allocator import AllocatorSettings
from vramlens.errors import VramlensError
from vramlens.hardware import GpuSpec
from vramlens.model.spec import ModelSpec
from vramlens.result.report import MemoryReport
from vramlens.simulator._guard import DEFAULT_TIMEOUT_S, deadline, failure_message
from vramlens.simulator.build import SimulationError, real_code_paths
from vramlens.simulator.report import BACKWARD_WORKSPACE_EVENT, simulation_report
from vramlens.workload.spec import Workload

if TYPE_CHECKING:
    from vramlens.result.timeline import Timeline

__all__ = ["run_simulation"]

_TRAINING_PHASES = ("forward", "backward", "optimizer_step")
_INFERENCE_PHASES = ("prefill", "decode")


def run_simulation(
    spec: ModelSpec,
    workload: Workload,
    gpu: GpuSpec | None,
    *,
    steps: int,
    capture_stacks: bool,
    allocator: AllocatorSettings | None,
    infer: bool,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    replay: bool = True,
) -> MemoryReport:
    """Simulate ``workload`` and report it (see :func:`vramlens.simulator.simulate`)."""
    require("torch", purpose="vramlens simulate")
    require("transformers", purpose="vramlens simulate")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vramlens.trace.tracker import MemoryTracker

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    tracker = MemoryTracker(capture_stacks=capture_stacks, clock="event")
    try:
        with real_code_paths(), deadline(timeout_s):
            phases: tuple[str, ...] = _INFERENCE_PHASES if infer else _TRAINING_PHASES
            timeline = None
            if infer:
                start, notes = 0, _inference(spec, workload, gpu, fake_mode, tracker)
            else:
                timeline, start, notes = _training(spec, workload, steps, fake_mode, tracker, replay)
    except VramlensError:
        raise
    except Exception as error:  # any failure inside foreign model code
        raise _failure(spec, error) from None
    finally:
        tracker.close()
    metadata = {"engine": "simulate", "model": spec.name, "device": "fake cpu"}
    if timeline is None:
        timeline = tracker.timeline(metadata)
    else:
        timeline = dataclasses.replace(timeline, metadata={**timeline.metadata, **metadata})
    return simulation_report(
        timeline,
        phases=phases,
        start=start,
        model=spec.name,
        workload=workload,
        gpu=gpu,
        notes=notes,
        allocator=allocator,
    )


def _training(
    spec: ModelSpec, workload: Workload, steps: int, fake_mode: Any, tracker: Any, replay: bool
) -> tuple[Timeline, int, list[str]]:
    from vramlens.resolve.context import resolve_training
    from vramlens.simulator.train import simulate_training

    ctx = resolve_training(spec, workload)
    run = simulate_training(ctx, steps=steps, fake_mode=fake_mode, tracker=tracker, replay=replay)
    notes = [*ctx.assumptions, *run.notes, f"{steps} training steps simulated; the last one is reported"]
    timeline = run.timeline
    if run.backward_blas_event >= 0:
        metadata = {**timeline.metadata, BACKWARD_WORKSPACE_EVENT: run.backward_blas_event}
        timeline = dataclasses.replace(timeline, metadata=metadata)
    return timeline, run.last_step_start, notes


def _inference(spec: ModelSpec, workload: Workload, gpu: GpuSpec | None, fake_mode: Any, tracker: Any) -> list[str]:
    from vramlens.estimator.infer.context import resolve_inference
    from vramlens.simulator.infer import simulate_inference

    ctx = resolve_inference(spec, workload, gpu)
    run = simulate_inference(ctx, fake_mode=fake_mode, tracker=tracker)
    return [*ctx.assumptions, *run.notes]


def _failure(spec: ModelSpec, error: Exception) -> SimulationError:
    return SimulationError(failure_message("model", spec.name, error, advice="use `vramlens estimate`"))
