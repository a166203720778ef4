"""The analytic engine: pure-Python memory estimates, term by term (no torch import)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from vramlens.errors import InputError
from vramlens.hardware import GpuSpec, resolve_gpu
from vramlens.model.resolve import load_model
from vramlens.model.spec import ModelSpec
from vramlens.result.report import MemoryReport
from vramlens.units import format_bytes
from vramlens.workload.load import load_workload
from vramlens.workload.options import Mode
from vramlens.workload.spec import Workload

__all__ = ["MAX_ESTIMATE_BYTES", "estimate", "estimate_resolved"]


def estimate(workload: Workload | Mapping[str, Any] | str | os.PathLike[str], **overrides: Any) -> MemoryReport:
    """Estimate per-GPU memory of a workload (a Workload, a dict, or a YAML/JSON path).

    Keyword ``overrides`` take precedence over the workload's keys (as CLI flags do).
    """
    resolved = load_workload(workload, overrides)
    spec = load_model(resolved.model)
    gpu = resolve_gpu(resolved.gpu) if resolved.gpu is not None else None
    return estimate_resolved(spec, resolved, gpu)


#: Largest per-GPU figure an estimate reports (1 EiB = 2**60 bytes, a million times any GPU): a
#: larger one comes from settings no run has, and past 2**63 it no longer fits the int64 columns
#: of pictures and timelines.
MAX_ESTIMATE_BYTES = 2**60


def estimate_resolved(spec: ModelSpec, workload: Workload, gpu: GpuSpec | None) -> MemoryReport:
    """The estimate of an already loaded workload and model: the engine for its mode (a
    one-line :class:`InputError` instead of a figure over :data:`MAX_ESTIMATE_BYTES`)."""
    if workload.mode is Mode.INFER:
        from vramlens.estimator.infer import estimate_inference

        report = estimate_inference(spec, workload, gpu=gpu)
    else:
        report = _training()(spec, workload, gpu=gpu)
    largest = max(report.device_bytes, report.reserved_bytes, report.allocated_bytes)
    if largest > MAX_ESTIMATE_BYTES:
        raise InputError(
            f"workload: {spec.name} needs {format_bytes(largest)} per GPU with these settings, over 1 EiB: no GPU "
            f"comes near; check batch ({workload.batch:,}), seq ({workload.seq:,}), context and max_num_seqs"
        )
    return report


def _training() -> Callable[..., MemoryReport]:
    """:func:`~vramlens.estimator.training.estimate_training`, imported by the first training
    estimate (an ``import`` statement in :func:`estimate_resolved` would run on every call)."""
    found = _TRAINING.get("estimate")
    if found is None:
        from vramlens.estimator.training import estimate_training

        found = _TRAINING["estimate"] = estimate_training
    return found


_TRAINING: dict[str, Callable[..., MemoryReport]] = {}
