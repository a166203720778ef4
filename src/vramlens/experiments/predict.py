"""vramlens's predictions for a run: the estimator's and the simulator's allocated-level peak.

Both take the run's workload (:meth:`~vramlens.experiments.matrix.RunSpec.workload`). Two
adjustments make them comparable with what the run measures:

* on CPU the cuBLAS workspaces (``CUBLAS_WORKSPACE_BYTES`` each, the main thread's and the
  autograd thread's, which both engines add to a training run on a CUDA device) do not exist, so
  they are taken off;
* ``memory-budget=X`` is not a workload key: torch's partitioner picks what to recompute so
  that the saved activations are about X of what the default compile keeps (0 is
  "recompute everything in the graph"). The estimate interpolates linearly between the
  compiled run without recompute (X = 1) and with full recompute (X = 0):
  ``peak(X) = peak_full + X * (peak_none - peak_full)``. Seed 004 measured 0.05 and 0.6
  (``docs/experiments.md`` compares).

The simulator cannot run compiled code, bitsandbytes or a user's module; those rows get no
simulated figure and a note saying why.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from vramlens.errors import InputError
from vramlens.experiments.matrix import RunSpec

__all__ = ["Prediction", "predict_run"]


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """The estimator's and simulator's allocated-level peaks (bytes) for one run."""

    predicted_peak_bytes: int | None
    simulated_peak_bytes: int | None
    notes: tuple[str, ...] = ()


def _device_adjustment(spec: RunSpec) -> int:
    """Bytes a CUDA-shaped report holds that the run's device does not (on CPU: the two cuBLAS
    workspaces of a training run, the main thread's and the autograd thread's)."""
    from vramlens.estimator.runtime import CUBLAS_WORKSPACE_BYTES

    return 2 * CUBLAS_WORKSPACE_BYTES if spec.device == "cpu" else 0


def _estimate(spec: RunSpec, workload: dict[str, Any]) -> int:
    from vramlens.estimator import estimate

    budget = spec.memory_budget
    if budget is None:
        return estimate(workload).allocated_bytes
    kept = estimate(workload | {"recompute": "none"}).allocated_bytes
    recomputed = estimate(workload | {"recompute": "full"}).allocated_bytes
    return round(recomputed + budget * (kept - recomputed))


def _simulate(spec: RunSpec, workload: dict[str, Any]) -> tuple[int | None, str | None]:
    from vramlens.experiments.techniques import TechniqueName
    from vramlens.simulator import simulate

    refused = {TechniqueName.COMPILE, TechniqueName.MEMORY_BUDGET, TechniqueName.OPTIMIZER_8BIT}
    blocked = [a.label for a in spec.techniques if a.name in refused]
    if blocked:
        return None, f"simulate: {blocked[0]} cannot run on fake tensors (estimate only)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers renaming its checkpointing method
            return simulate(workload).allocated_bytes, None
    except InputError as error:
        return None, f"simulate: {error}"


def predict_run(spec: RunSpec, *, simulate: bool = True) -> Prediction:
    """Predict ``spec``'s measured peak with the estimator (and the simulator unless
    ``simulate=False``; it builds the real model on fake tensors, about a second per step at 1B)."""
    workload = spec.workload()
    if workload is None:
        return Prediction(predicted_peak_bytes=None, simulated_peak_bytes=None,
                          notes=("a user's module: no model config to predict from",))  # fmt: skip
    adjust = _device_adjustment(spec)
    notes: list[str] = []
    if adjust:
        notes.append("cpu: the cuBLAS workspaces the engines count for CUDA are left out")
    if spec.memory_budget is not None:
        notes.append(f"memory-budget {spec.memory_budget:g}: interpolated between compiled recompute none and full")
    try:
        predicted: int | None = _estimate(spec, workload) - adjust
    except InputError as error:
        predicted = None
        notes.append(f"estimate: {error}")
    simulated, note = _simulate(spec, workload) if simulate else (None, "simulate: not requested")
    if note:
        notes.append(note)
    return Prediction(
        predicted_peak_bytes=predicted,
        simulated_peak_bytes=None if simulated is None else simulated - adjust,
        notes=tuple(notes),
    )
