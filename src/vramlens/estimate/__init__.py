"""The analytic engine: pure-Python memory estimates, term by term (no torch import)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from vramlens.estimate.time import StepTime, step_time
from vramlens.hardware import GpuSpec, resolve_gpu
from vramlens.model.resolve import load_model
from vramlens.model.spec import ModelSpec
from vramlens.report.model import MemoryReport
from vramlens.workload.load import load_workload
from vramlens.workload.options import Mode
from vramlens.workload.spec import Workload

__all__ = ["StepTime", "estimate", "estimate_resolved", "step_time"]


def estimate(workload: Workload | Mapping[str, Any] | str | os.PathLike[str], **overrides: Any) -> MemoryReport:
    """Estimate per-GPU memory of a workload (a Workload, a dict, or a YAML/JSON path).

    Keyword ``overrides`` take precedence over the workload's keys (as CLI flags do).
    """
    resolved = load_workload(workload, overrides)
    spec = load_model(resolved.model)
    gpu = resolve_gpu(resolved.gpu) if resolved.gpu is not None else None
    return estimate_resolved(spec, resolved, gpu)


def estimate_resolved(spec: ModelSpec, workload: Workload, gpu: GpuSpec | None) -> MemoryReport:
    """The estimate of an already loaded workload and model: the engine for its mode."""
    if workload.mode is Mode.INFER:
        from vramlens.estimate.infer import estimate_inference

        return estimate_inference(spec, workload, gpu=gpu)
    from vramlens.estimate.training import estimate_training

    return estimate_training(spec, workload, gpu=gpu)
