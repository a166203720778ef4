"""What the page shows, formatted on the server with the CLI's own formatters.

The page never computes or formats a number: every value comes as bytes (``int``) beside the
string ``vramlens estimate`` prints for it (:func:`vramlens.units.format_bytes`, the share as
``{:.1%}``, the headline and the fit line of :mod:`vramlens.report.text`), so the browser shows
exactly what the terminal shows for the same workload. Planner rows use the formats of
``vramlens plan`` (GiB with one decimal, relative step time as ``1.00x``).
"""

from __future__ import annotations

from typing import Any

from vramlens.categories import Category
from vramlens.planner import Plan
from vramlens.planner.render.text import candidate_cells, plan_searched, plan_title
from vramlens.report.palette import swatch
from vramlens.report.text import fit_line, headline, level_rows, serving_lines
from vramlens.report.view_text import view_headline
from vramlens.result.report import MemoryReport
from vramlens.units import format_bytes

__all__ = ["present_gpus", "present_plan", "present_report", "present_view"]

#: Each category's color (:mod:`vramlens.report.palette`), looked up once.
_COLORS = {category: swatch(category).hex for category in Category}


def _amount(value: int | None) -> dict[str, Any]:
    """Bytes and the CLI's string for them (``None``: not recorded)."""
    return {"bytes": value, "text": "not recorded" if value is None else format_bytes(value)}


def _levels(report: MemoryReport) -> list[dict[str, Any]]:
    return [{"level": name, **_amount(value), "what": what} for name, value, what in level_rows(report)]


def _breakdown(report: MemoryReport) -> dict[str, Any]:
    """The breakdown table at the peak: as ``vramlens estimate`` lists it, largest first."""
    peak = report.peak
    items = [(c, b) for c, b in peak.breakdown.items() if b]
    items.append((Category.ALLOCATOR_SLACK, report.allocator_slack_bytes))
    if report.device_known:  # a record without the device level has no runtime to show
        items.append((Category.RUNTIME, report.runtime_bytes))
    total = report.device_bytes or 1
    rows = [
        {
            "category": category.value,
            "name": category.value.replace("_", " "),
            "color": _COLORS[category],
            **_amount(value),
            "fraction": round(value / total, 5),
            "share": f"{value / total:6.1%}".strip(),
        }
        for category, value in sorted(items, key=lambda item: -item[1])
    ]
    return {"title": f"at the peak: {peak.name} ({peak.note})", "rows": rows}


def _phases(report: MemoryReport) -> list[dict[str, Any]]:
    top = max(phase.allocated_bytes for phase in report.phases) or 1
    return [
        {
            "name": phase.name,
            "peak": phase.name == report.peak_phase,
            **_amount(phase.allocated_bytes),
            "fraction": round(phase.allocated_bytes / top, 5),
            "note": phase.note,
            "parts": [
                {"category": c.value, "color": _COLORS[c], "fraction": round(b / top, 5), **_amount(b)}
                for c, b in phase.breakdown.items()
                if b > 0
            ],
        }
        for phase in report.phases
    ]


def present_report(report: MemoryReport) -> dict[str, Any]:
    """The page's view of a report: headline, fit, settings, levels, breakdown, phases, serving, assumptions."""
    from vramlens.result.settings import settings_line

    headroom = report.headroom_bytes
    return {
        "title": headline(report),
        "settings": settings_line(report) or "",
        "fit": {
            "fits": report.fits,
            "text": fit_line(report).plain,
            "gpu": report.gpu,
            "capacity": None if report.capacity_bytes is None else _amount(report.capacity_bytes),
            "headroom": None if headroom is None else _amount(headroom),
        },
        "levels": _levels(report),
        "breakdown": _breakdown(report),
        "phases": _phases(report),
        "serving": serving_lines(report),
        "assumptions": list(report.assumptions),
    }


def present_view(report: MemoryReport, details: dict[str, Any]) -> dict[str, Any]:
    """The snapshot page's view of a measured record: the report's view, where it came from,
    and the largest allocations at the peak (``details``: ``ViewReport.to_dict()``)."""
    source = details.get("source") or {}
    top = [
        {**_amount(int(item["bytes"])), **{key: item.get(key) for key in ("category", "module", "phase")}}
        for item in details.get("top_allocations") or []
    ]
    summary = present_report(report)
    summary["title"] = view_headline(report, source.get("format"))
    return {
        "summary": summary,
        "source": f"{source.get('path')}: {source.get('format')}, categories {source.get('categories')}",
        "top": top,
    }


def present_plan(result: Plan, *, top: int) -> dict[str, Any]:
    """The planner's best ``top`` configurations, in the formats of ``vramlens plan``."""
    rows = []
    for rank, cand in enumerate(result.candidates[:top], start=1):
        cells = candidate_cells(cand)
        rows.append(
            {
                "rank": rank,
                "peak": {"bytes": cand.report.device_bytes, "text": cells["peak"]},
                "headroom": {"bytes": cand.headroom_bytes, "text": cells["headroom"]},
                "relative_step_time": cells["relative_step_time"],
                "changes": cells["changes"],
                "workload": cand.to_dict()["workload"],
            }
        )
    return {
        "title": plan_title(result),
        "searched": plan_searched(result),
        "impossible": result.impossible,
        "rows": rows,
    }


def present_gpus() -> list[dict[str, Any]]:
    """The GPU table as ``GET /api/gpus`` sends it: names, aliases, capacity as bytes and text, its basis."""
    from vramlens.hardware import gpu_table

    return [
        {
            "name": gpu.name,
            "display_name": gpu.display_name,
            "aliases": list(gpu.aliases),
            "memory": {"bytes": gpu.memory_bytes, "text": format_bytes(gpu.memory_bytes)},
            "capacity_basis": gpu.capacity_basis,
        }
        for gpu in gpu_table()
    ]
