"""A simulated run's events as a :class:`MemoryReport` at the three memory levels.

* Tensor level: the timeline itself (raw storage bytes, exactly what the implementation
  asked for; equal to a tracked real CPU run).
* ``allocated``: every allocation rounded up to the CUDA caching allocator's 512-byte
  blocks (``kMinBlockSize``), plus the cuBLAS workspaces the estimator also counts
  (CUDA allocations a CPU run does not make: the main thread's, and from the first backward's
  first cuBLAS operator on the autograd thread's, :mod:`vramlens.simulator._blas`), at the peak
  of the measured step.
* ``reserved``: the same events replayed through the caching-allocator model
  (:mod:`vramlens.allocator`): segments, block splitting, cached free blocks.
* ``device``: reserved plus the CUDA runtime (context, NCCL), the estimator's constants.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vramlens.allocator import AllocatorSettings, replay
from vramlens.categories import Category
from vramlens.estimator.runtime import CUBLAS_WORKSPACE_BYTES, runtime_parts
from vramlens.hardware import GpuSpec
from vramlens.result.report import MemoryReport, PhaseMemory
from vramlens.result.timeline import Timeline, allocated_timeline
from vramlens.units import format_bytes
from vramlens.workload.spec import Parallelism, Workload

__all__ = ["BACKWARD_WORKSPACE_EVENT", "allocated_timeline", "simulation_report"]

#: Timeline metadata key: the index at which the autograd thread's cuBLAS workspace is allocated
#: (:mod:`vramlens.simulator._blas`); absent when no backward ran a cuBLAS operator.
BACKWARD_WORKSPACE_EVENT = "backward_cublas_event"


def _workspaces_at(timeline: Timeline, event: int) -> int:
    """Bytes of cuBLAS workspace alive at ``event``: the main thread's (32 MiB, taken before the
    run's first event), and the autograd thread's from its index on (CublasHandlePool.cpp: one
    workspace per handle and stream, handles per thread)."""
    backward = timeline.metadata.get(BACKWARD_WORKSPACE_EVENT, -1)
    return CUBLAS_WORKSPACE_BYTES * (2 if 0 <= backward <= event else 1)


def _phase_memory(rounded: Timeline, name: str, start: int) -> PhaseMemory | None:
    """A phase's peak over the measured step: the highest live total during its events or
    at the moment each of its stretches begins (memory it inherits counts)."""
    code = rounded.phases.index(name) if name in rounded.phases else -1
    indexes = np.flatnonzero(rounded.phase[start:] == code) + start
    if code < 0 or not len(indexes):
        return None
    beginnings = indexes[np.diff(indexes, prepend=-2) != 1] - 1
    candidates = np.concatenate([beginnings[beginnings >= 0], indexes])
    at = int(candidates[np.argmax(rounded.live_bytes[candidates])])
    breakdown = dict(rounded.breakdown_at(at))
    breakdown[Category.OTHER] = breakdown.get(Category.OTHER, 0) + _workspaces_at(rounded, at)
    clean = {category: value for category, value in breakdown.items() if value}
    module = rounded.modules[rounded.module[at]] if rounded.module[at] >= 0 else "-"
    return PhaseMemory(
        name=name,
        allocated_bytes=sum(clean.values()),
        breakdown=clean,
        note=f"simulated peak at event {at} in {module}",
    )


def _reserved(timeline: Timeline, settings: AllocatorSettings) -> tuple[int, int]:
    """Peak reserved bytes and OOM count of the run replayed with the cuBLAS workspace first and
    the autograd thread's where its first cuBLAS operator made it (:data:`BACKWARD_WORKSPACE_EVENT`),
    each allocation on the stream it was recorded on (FSDP's collectives: :mod:`vramlens.allocator.streams`)."""
    where = [0]
    backward = timeline.metadata.get(BACKWARD_WORKSPACE_EVENT, -1)
    if 0 <= backward <= len(timeline):
        where.append(backward)
    sizes = np.insert(timeline.nbytes, where, CUBLAS_WORKSPACE_BYTES)
    keys = np.insert(timeline.storage, where, [-1 - n for n in range(len(where))])
    streams = None if timeline.stream is None else np.insert(timeline.stream, where, 0)
    result = replay(sizes, keys, streams, settings=settings)
    return result.peak_reserved_bytes, len(result.ooms)


def _runtime(workload: Any) -> dict[str, int]:
    """The device level's parts beyond reserved (:func:`vramlens.estimator.runtime.runtime_parts`):
    the workload's parallelism, one GPU for a user's own module."""
    return runtime_parts(workload.parallel if isinstance(workload, Workload) else Parallelism())


def simulation_report(
    timeline: Timeline,
    *,
    phases: Sequence[str],
    start: int,
    model: str,
    workload: Any,
    gpu: GpuSpec | None,
    notes: Sequence[str],
    allocator: AllocatorSettings | None = None,
) -> MemoryReport:
    """The report of a simulated run; ``start`` is the first event of the measured step.

    ``workload`` is the :class:`Workload` that ran, or, for a user's own module
    (:func:`vramlens.simulator.simulate_module`), the dict that describes the run (one GPU).
    """
    rounded = allocated_timeline(timeline)
    found = [phase for phase in (_phase_memory(rounded, name, start) for name in phases) if phase is not None]
    if not found:
        raise ValueError("the simulated run recorded no events in its phases")
    peak = max(found, key=lambda phase: phase.allocated_bytes)
    conf = workload.alloc_conf if isinstance(workload, Workload) else ""
    settings = allocator or AllocatorSettings.from_conf(conf, capacity_bytes=gpu.memory_bytes if gpu else None)
    reserved, ooms = _reserved(timeline, settings)
    reserved = max(reserved, peak.allocated_bytes)
    runtime = _runtime(workload)
    assumptions = [
        *notes,
        f"tensor peak {format_bytes(timeline.peak_bytes)} (raw storage bytes, as a CPU run allocates them); "
        "allocated rounds each tensor to 512 B blocks and adds the 32 MiB cuBLAS workspace "
        "(and the autograd thread's own from the first backward's first matmul on)",
        "reserved: the events replayed through vramlens' model of the CUDA caching allocator",
    ]
    if ooms:
        assumptions.append(f"the allocator replay ran out of the GPU's memory {ooms} time(s)")
    return MemoryReport(
        engine="simulate",
        model=model,
        workload=workload,
        phases=tuple(found),
        peak_phase=peak.name,
        allocated_bytes=peak.allocated_bytes,
        reserved_bytes=reserved,
        device_bytes=reserved + sum(runtime.values()),
        runtime=runtime,
        assumptions=tuple(assumptions),
        gpu=gpu.name if gpu else None,
        capacity_bytes=gpu.memory_bytes if gpu else None,
        timeline=timeline,
    )
