"""The simulator: run the real model code on fake tensors and record every allocation.

``simulate(workload)`` builds the transformers model of the workload's config on fake CPU
tensors (no weights, no memory), runs training steps or a generate() prefill and decode
step under :class:`~vramlens.trace.tracker.MemoryTracker`, and returns a
:class:`~vramlens.result.report.MemoryReport` whose ``timeline`` holds every tensor event.
Needs the [torch] and [hf] extras (imported only when called).

``simulate_module(build, step)`` does the same for your own ``nn.Module`` and step
function (needs only the [torch] extra; see :mod:`vramlens.simulator.module`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from vramlens.allocator import AllocatorSettings
from vramlens.errors import InputError
from vramlens.hardware import GpuSpec, resolve_gpu
from vramlens.model.resolve import load_model
from vramlens.model.spec import ModelSpec
from vramlens.result.report import MemoryReport
from vramlens.simulator._guard import DEFAULT_TIMEOUT_S, check_timeout
from vramlens.simulator.build import SimulationError
from vramlens.simulator.module import simulate_module
from vramlens.workload.load import load_workload
from vramlens.workload.options import Mode
from vramlens.workload.spec import Workload

__all__ = ["SimulationError", "simulate", "simulate_module", "simulate_resolved"]

#: Training steps simulated by default: the first creates the optimizer state, the second is measured.
DEFAULT_STEPS = 2


def simulate(
    workload: Workload | Mapping[str, Any] | str | os.PathLike[str],
    *,
    steps: int = DEFAULT_STEPS,
    capture_stacks: bool = False,
    allocator: AllocatorSettings | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    replay: bool = True,
    **overrides: Any,
) -> MemoryReport:
    """Simulate one workload (a Workload, a dict, or a YAML/JSON path) on fake tensors.

    ``steps`` training steps run and the last is reported; ``capture_stacks`` records the
    Python stack of each allocation in the timeline; ``allocator`` sets the caching
    allocator model (default: the workload's ``alloc_conf`` and the
    GPU's capacity); ``timeout_s`` limits the wall time (None: no limit; the limit works
    in the main thread on POSIX); ``replay`` (default) runs each kind of repeated decoder layer
    once and replays its events for the layers like it, with the same events as running every
    layer (False runs every layer). Keyword ``overrides`` take precedence over the workload's keys.
    """
    resolved = load_workload(workload, overrides)
    spec = load_model(resolved.model)
    gpu = resolve_gpu(resolved.gpu) if resolved.gpu is not None else None
    return simulate_resolved(
        spec,
        resolved,
        gpu,
        steps=steps,
        capture_stacks=capture_stacks,
        allocator=allocator,
        timeout_s=timeout_s,
        replay=replay,
    )


def simulate_resolved(
    spec: ModelSpec,
    workload: Workload,
    gpu: GpuSpec | None,
    *,
    steps: int = DEFAULT_STEPS,
    capture_stacks: bool = False,
    allocator: AllocatorSettings | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    replay: bool = True,
) -> MemoryReport:
    """The simulation of an already loaded workload and model (``replay``: see :func:`simulate`)."""
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 100:
        raise InputError(f"steps: {steps!r}; accepted: an integer from 1 to 100")
    check_timeout(timeout_s)
    from vramlens.simulator._run import run_simulation

    return run_simulation(
        spec,
        workload,
        gpu,
        steps=steps,
        capture_stacks=capture_stacks,
        allocator=allocator,
        infer=workload.mode is Mode.INFER,
        timeout_s=timeout_s,
        replay=replay,
    )
