"""The words and number formats of a plan, shared by ``vramlens plan`` and the web page."""

from __future__ import annotations

from typing import Any

from vramlens.planner.model import Candidate, Change, Plan
from vramlens.units import GiB

__all__ = ["candidate_cells", "changes_text", "plan_searched", "plan_title"]


def plan_title(result: Plan) -> str:
    """``plan for MODEL on N x GPU (10% headroom): K configurations, step time relative to ...``."""
    model = result.workload.model if isinstance(result.workload.model, str) else result.workload.model.name
    return (
        f"plan for {model} on {result.gpus} x {result.gpu} ({result.headroom:.0%} headroom): "
        f"{len(result.candidates)} configurations, step time relative to {result.reference}"
    )


def plan_searched(result: Plan) -> str:
    return f"searched {result.considered} configurations ({result.estimated} estimated)"


def changes_text(changes: tuple[Change, ...]) -> str:
    """``key=new, key=new`` (``(none)`` for the user's own configuration)."""
    return ", ".join(f"{key}={new}" for key, _, new in changes) or "(none)"


def candidate_cells(candidate: Candidate) -> dict[str, Any]:
    """One entry's cells as the table shows them: peak and headroom in GiB with one decimal,
    the relative step time as ``1.00x``, the changes."""
    return {
        "peak": f"{candidate.report.device_bytes / GiB:.1f} GiB",
        "headroom": f"{candidate.headroom_bytes / GiB:.1f} GiB",
        "relative_step_time": f"{candidate.relative_step_time:.2f}x",
        "changes": changes_text(candidate.changes),
    }
