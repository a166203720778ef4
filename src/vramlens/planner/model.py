"""The planner's answer: :class:`Plan` and its :class:`Candidate` entries (JSON-safe via ``to_dict``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramlens.result.report import MemoryReport
from vramlens.workload.load import workload_to_dict
from vramlens.workload.spec import Workload

__all__ = ["Candidate", "Change", "Plan", "workload_changes"]

#: One difference from the user's workload: (dotted key, old value, new value), JSON-safe values.
Change = tuple[str, Any, Any]


def _flat(data: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{inner}": v for inner, v in value.items()})
        else:
            flat[key] = value
    return flat


def workload_changes(user: Workload, other: Workload) -> tuple[Change, ...]:
    """The keys whose values differ between two workloads, in the contract's key order."""
    old, new = _flat(workload_to_dict(user)), _flat(workload_to_dict(other))
    return tuple((key, old.get(key), value) for key, value in new.items() if old.get(key) != value)


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """One configuration that fits, with its estimate and estimated step time."""

    workload: Workload
    report: MemoryReport
    headroom_bytes: int
    """Capacity minus the device-level peak, per GPU (bytes)."""
    step_seconds: float
    """The time model's seconds per optimizer step (ranking only; not a promise)."""
    relative_step_time: float
    """``step_seconds`` over the plan's reference (the user's config if it fits, else the fastest)."""
    changes: tuple[Change, ...]
    """(key, old, new) against the user's workload."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the full workload, the report's peak, headroom, relative time and changes."""
        report = self.report.to_dict()
        return {
            "workload": workload_to_dict(self.workload),
            "peak": report["peak"],
            "headroom_bytes": self.headroom_bytes,
            "relative_step_time": round(self.relative_step_time, 4),
            "step_seconds": self.step_seconds,
            "changes": [{"key": k, "old": old, "new": new} for k, old, new in self.changes],
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """Configurations that fit, best (fastest) first; ``impossible`` says why none does."""

    workload: Workload
    """The user's workload (with the planned gpu and gpus)."""
    gpu: str
    gpus: int
    headroom: float
    """Fraction of each GPU's capacity kept free."""
    candidates: tuple[Candidate, ...]
    reference: str
    """What ``relative_step_time`` is relative to: "your configuration" or "the fastest that fits"."""
    user_fits: bool
    considered: int
    """Configurations the search covered (estimated, implied to fit, or pruned with their group)."""
    estimated: int
    """Configurations the estimator ran on."""
    impossible: str | None = None
    """Why nothing fits, and the smallest setup that would (None when something fits)."""
    explored: tuple[tuple[int, float], ...] = ()
    """(device peak bytes, relative step time) of every fitting frontier point, dominated ones
    included (for the memory-vs-time picture)."""

    def to_dict(self) -> dict[str, Any]:
        """``{"candidates": [...best first], "impossible"?: str, ...}`` (JSON-safe)."""
        data: dict[str, Any] = {
            "gpu": self.gpu,
            "gpus": self.gpus,
            "headroom": self.headroom,
            "reference": self.reference,
            "user_fits": self.user_fits,
            "considered": self.considered,
            "estimated": self.estimated,
            "candidates": [c.to_dict() for c in self.candidates],
        }
        if self.impossible is not None:
            data["impossible"] = self.impossible
        return data
