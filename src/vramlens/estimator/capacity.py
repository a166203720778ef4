"""Capacity answers: the largest batch, or the longest context, that fits a GPU.

Both are searches over the estimator itself (exponential growth, then bisection),
so the answer is consistent with :func:`vramlens.estimator` by construction: the
estimate at the answer fits and the estimate one above it does not. Memory grows
monotonically with batch and context in every engine, which the search relies on.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vramlens.errors import InputError
from vramlens.estimator import estimate_resolved
from vramlens.estimator.infer.context import inference_engine
from vramlens.hardware import resolve_gpu
from vramlens.model.resolve import load_model
from vramlens.model.spec import ModelSpec
from vramlens.result.report import MemoryReport
from vramlens.workload.load import load_workload
from vramlens.workload.options import Engine, Mode
from vramlens.workload.spec import Workload

__all__ = ["CapacityAnswer", "max_batch", "max_context", "search_capacity"]

#: Upper end of the batch search when nothing else bounds it.
MAX_SEARCH_BATCH = 1 << 20
#: Upper end of the context search with ``allow_long_context``.
MAX_SEARCH_CONTEXT = 1 << 24

Source = Workload | Mapping[str, Any] | str | os.PathLike[str]


@dataclass(frozen=True, kw_only=True, slots=True)
class CapacityAnswer:
    """The largest value of ``key`` that fits (0: not even the smallest) and the report there."""

    key: str
    """"batch" or "context"."""
    value: int
    limit: int
    """The largest value searched (max_num_seqs, max_position_embeddings, or the search cap)."""
    report: MemoryReport | None
    """The estimate at ``value`` (None when nothing fits)."""
    evaluations: int
    """Estimates the search ran."""


def _largest(fits: Callable[[int], MemoryReport | None], limit: int) -> tuple[int, MemoryReport | None]:
    """Largest ``n`` in [1, limit] whose report fits (``fits`` returns it, or None)."""
    best: tuple[int, MemoryReport | None] = (0, None)
    low, high = 0, 1
    while high <= limit:
        report = fits(high)
        if report is None:
            break
        best, low, high = (high, report), high, high * 2
    high = min(high, limit + 1)  # invariant: low fits (or is 0), high does not (or is beyond the limit)
    while high - low > 1:
        middle = (low + high) // 2
        report = fits(middle)
        if report is None:
            high = middle
        else:
            best, low = (middle, report), middle
    return best


def _limit(spec: ModelSpec, workload: Workload, key: str) -> int:
    if key == "batch":
        vllm = workload.mode is Mode.INFER and inference_engine(workload) is Engine.VLLM
        return workload.max_num_seqs if vllm else MAX_SEARCH_BATCH
    if workload.allow_long_context:
        return MAX_SEARCH_CONTEXT
    return spec.max_position_embeddings


def search_capacity(source: Source, key: str, **overrides: Any) -> CapacityAnswer:
    """The largest ``batch`` (any mode) or inference ``context`` whose estimate fits the workload's GPU."""
    workload = load_workload(source, overrides)
    if workload.gpu is None:
        raise InputError("gpu: a capacity answer needs a GPU (e.g. gpu: h100-80gb, or a size such as 24GiB)")
    if key == "context" and workload.mode is not Mode.INFER:
        raise InputError("mode: the longest context is an inference answer; use mode: infer (or ask for the batch)")
    if key not in ("batch", "context"):
        raise InputError(f"capacity: unknown answer {key!r}; expected batch or context")
    spec, gpu = load_model(workload.model), resolve_gpu(workload.gpu)
    workload = dataclasses.replace(workload, model=spec)

    def fits(value: int) -> MemoryReport | None:
        changed = (
            dataclasses.replace(workload, batch=value)
            if key == "batch"
            else dataclasses.replace(workload, context=value)
        )
        report = estimate_resolved(spec, changed, gpu)
        return report if report.fits else None

    calls = 0

    def counted(value: int) -> MemoryReport | None:
        nonlocal calls
        calls += 1
        return fits(value)

    limit = _limit(spec, workload, key)
    value, report = _largest(counted, limit)
    return CapacityAnswer(key=key, value=value, limit=limit, report=report, evaluations=calls)


def max_batch(workload: Source, **overrides: Any) -> int:
    """Largest batch (training micro-batch, or concurrent inference sequences) that fits the GPU; 0 if none."""
    return search_capacity(workload, "batch", **overrides).value


def max_context(workload: Source, **overrides: Any) -> int:
    """Longest inference context (prompt + generated tokens, prefilled whole) at the workload's
    batch that fits the GPU; 0 if none."""
    return search_capacity(workload, "context", **overrides).value
