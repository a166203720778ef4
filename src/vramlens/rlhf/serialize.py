"""The JSON-safe form of an :class:`~vramlens.rlhf.report.RlhfReport` and its setup."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from vramlens.rlhf.report import RlhfPhase, RlhfReport
from vramlens.rlhf.setup import RlhfSetup

__all__ = ["report_to_dict", "setup_to_dict"]


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)  # StrEnum members become plain strings
    return value


def setup_to_dict(setup: RlhfSetup) -> dict[str, Any]:
    """Every field of the setup, defaults filled in (``None`` for an absent role)."""
    data = _plain(asdict(setup))
    data.pop("assumptions", None)
    return dict(data)


def _phase(phase: RlhfPhase) -> dict[str, Any]:
    return {
        "name": phase.name,
        "allocated_bytes": phase.allocated_bytes,
        "reserved_bytes": phase.reserved_bytes,
        "device_bytes": phase.device_bytes,
        "breakdown": dict(phase.breakdown),
        "models": {
            role: {
                "role": s.role, "where": s.where, "bytes": s.bytes, "breakdown": dict(s.breakdown),
                "busy": s.busy, "group": s.group,
            }
            for role, s in phase.models.items()
        },
        "gpu_group": phase.gpu_group,
        "busy_group": phase.busy_group,
        "note": phase.note,
    }  # fmt: skip


def report_to_dict(report: RlhfReport) -> dict[str, Any]:
    """``{"phases", "peak", "fits", "capacity_bytes", "headroom_bytes", "transitions",
    "recommendations", "assumptions", "setup"}``; bytes are ints per GPU."""
    return {
        "engine": "rlhf-estimate",
        "phases": [_phase(p) for p in report.phases],
        "peak": {
            "allocated_bytes": report.peak_allocated_bytes,
            "reserved_bytes": report.peak_reserved_bytes,
            "device_bytes": report.peak_device_bytes,
            "phase": report.peak_phase,
        },
        "fits": report.fits,
        "capacity_bytes": report.capacity_bytes,
        "headroom_bytes": report.headroom_bytes,
        "transitions": [asdict(t) for t in report.transitions],
        "recommendations": [
            {"text": r.text, "saves_bytes": r.saves_bytes, "changes": [list(_plain(c)) for c in r.changes]}
            for r in report.recommendations
        ],
        "assumptions": list(report.assumptions),
        "setup": setup_to_dict(report.setup),
    }
