"""Side-by-side comparison of reports of the same workload (estimate vs simulate vs measured).

:func:`compare_reports` computes; :func:`comparison_table` and :func:`comparison_dict`
present. Rows are the peak at each memory level, each phase's allocated peak, and each
category of the breakdown at the peak; differences are relative to the first report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from vramlens.categories import Category
from vramlens.result.report import MemoryReport
from vramlens.units import format_bytes

__all__ = ["Comparison", "ComparisonRow", "compare_reports", "comparison_dict", "comparison_table"]


@dataclass(frozen=True, kw_only=True)
class ComparisonRow:
    """One quantity in every report (None where a report has no such phase or category)."""

    section: str
    """``peak``, ``phase`` or ``category``."""
    name: str
    values: tuple[int | None, ...]

    def relative(self, index: int) -> float | None:
        """(report ``index`` - first report) / first report, or None when not comparable."""
        base, other = self.values[0], self.values[index]
        if base is None or other is None or base == 0:
            return None
        return (other - base) / base


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Rows comparing several reports of one workload."""

    engines: tuple[str, ...]
    rows: tuple[ComparisonRow, ...]


def compare_reports(reports: Sequence[MemoryReport]) -> Comparison:
    """Compare peaks, phases and peak categories of ``reports`` (at least two)."""
    if len(reports) < 2:
        raise ValueError("compare_reports: needs at least two reports")
    rows = [
        ComparisonRow(section="peak", name=level, values=tuple(getattr(r, f"{level}_bytes") for r in reports))
        for level in ("allocated", "reserved", "device")
    ]
    phase_names = list(dict.fromkeys(phase.name for report in reports for phase in report.phases))
    for name in phase_names:
        values = tuple(_phase_value(report, name) for report in reports)
        rows.append(ComparisonRow(section="phase", name=name, values=values))
    for category in Category:
        values = tuple(report.breakdown.get(category) for report in reports)
        if any(values):
            rows.append(ComparisonRow(section="category", name=category.value, values=values))
    return Comparison(engines=tuple(report.engine for report in reports), rows=tuple(rows))


def _phase_value(report: MemoryReport, name: str) -> int | None:
    return next((phase.allocated_bytes for phase in report.phases if phase.name == name), None)


def _cell(value: int | None) -> str:
    return "-" if value is None else format_bytes(value)


def _delta(row: ComparisonRow, index: int) -> str:
    relative = row.relative(index)
    return "-" if relative is None else f"{relative * 100:+.1f}%"


def comparison_table(comparison: Comparison) -> Table:
    """A rich table: one row per quantity, one column per engine, then the differences."""
    table = Table(title="comparison (differences relative to the first column)")
    table.add_column("what")
    for engine in comparison.engines:
        table.add_column(engine, justify="right")
    for engine in comparison.engines[1:]:
        table.add_column(f"{engine} vs {comparison.engines[0]}", justify="right")
    for row in comparison.rows:
        label = f"{row.section}: {row.name}"
        deltas = [_delta(row, index) for index in range(1, len(row.values))]
        table.add_row(label, *[_cell(value) for value in row.values], *deltas)
    return table


def comparison_dict(comparison: Comparison) -> dict[str, Any]:
    """JSON-safe form: ``{"engines": [...], "rows": [{"section", "name", "bytes": {engine: n}, "relative": {engine: x}}]}``."""
    rows = []
    for row in comparison.rows:
        rows.append(
            {
                "section": row.section,
                "name": row.name,
                "bytes": dict(zip(comparison.engines, row.values, strict=True)),
                "relative": {comparison.engines[i]: row.relative(i) for i in range(1, len(row.values))},
            }
        )
    return {"engines": list(comparison.engines), "rows": rows}
