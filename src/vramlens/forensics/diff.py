"""Views of several records: one run's ranks side by side (``vramlens view r0.npz r1.npz``) and
two runs compared (``vramlens diff A B``). Computation only; tables in :mod:`vramlens.report.view_text`.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramlens.categories import Category
from vramlens.forensics.sources import Source
from vramlens.forensics.view import NO_PHASE, ViewReport, build_view
from vramlens.result.timeline import allocated_timeline

__all__ = ["DiffRow", "RankPeak", "RankView", "ViewDiff", "build_ranks", "diff_views"]

_RANK = re.compile(r"rank[_\-]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True, slots=True)
class RankPeak:
    """The peak of one rank's record."""

    rank: int
    path: str
    allocated_bytes: int
    tensor_bytes: int | None
    reserved_at_dump_bytes: int | None
    phase: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {
            "rank": self.rank,
            "path": self.path,
            "allocated_bytes": self.allocated_bytes,
            "tensor_bytes": self.tensor_bytes,
            "reserved_at_dump_bytes": self.reserved_at_dump_bytes,
            "phase": self.phase,
        }


@dataclass(frozen=True, kw_only=True, eq=False)
class RankView:
    """Per-rank peaks (allocated level), their skew, and the full view of the highest rank."""

    ranks: tuple[RankPeak, ...]
    detailed: ViewReport

    @property
    def skew_bytes(self) -> int:
        """Highest minus lowest per-rank peak."""
        peaks = [rank.allocated_bytes for rank in self.ranks]
        return max(peaks) - min(peaks)

    @property
    def max_over_median(self) -> float:
        """Highest per-rank peak over the median one (1.0: balanced)."""
        peaks = [rank.allocated_bytes for rank in self.ranks]
        middle = statistics.median(peaks)
        return max(peaks) / middle if middle else 1.0

    @property
    def detailed_rank(self) -> int:
        """The rank with the highest peak (the one viewed in detail)."""
        return max(self.ranks, key=lambda rank: rank.allocated_bytes).rank

    def to_dict(self) -> dict[str, Any]:
        """The highest rank's view dict plus ``ranks``."""
        data = self.detailed.to_dict()
        data["ranks"] = {
            "per_rank": [rank.to_dict() for rank in self.ranks],
            "skew_bytes": self.skew_bytes,
            "max_over_median": round(self.max_over_median, 4),
            "detailed_rank": self.detailed_rank,
        }
        return data


def _rank_of(source: Source, position: int) -> int:
    """The record's rank: its metadata ``rank``, a ``rank<N>`` in its file name, else its position."""
    stated = source.timeline.metadata.get("rank")
    if isinstance(stated, int) and not isinstance(stated, bool):
        return stated
    match = _RANK.search(Path(source.path).name)
    return int(match.group(1)) if match else position


def build_ranks(sources: Sequence[Source], **options: Any) -> RankView:
    """Peaks of every rank's record and the view (``build_view(**options)``) of the highest."""
    numbers = [_rank_of(source, position) for position, source in enumerate(sources)]
    if len(set(numbers)) != len(numbers):
        numbers = list(range(len(sources)))
    peaks = []
    for number, source in zip(numbers, sources, strict=True):
        timeline = source.timeline
        rounded = timeline if timeline.level == "allocated" else allocated_timeline(timeline)
        code = int(rounded.phase[rounded.peak_index]) if len(rounded) else -1
        dump = timeline.metadata.get("reserved_bytes")
        peaks.append(
            RankPeak(
                rank=number,
                path=source.path,
                allocated_bytes=rounded.peak_bytes,
                tensor_bytes=timeline.peak_bytes if timeline.level == "tensor" else None,
                reserved_at_dump_bytes=dump if isinstance(dump, int) else None,
                phase=rounded.phases[code] if code >= 0 else NO_PHASE,
            )
        )
    highest = max(range(len(peaks)), key=lambda index: peaks[index].allocated_bytes)
    ordered = tuple(sorted(peaks, key=lambda rank: rank.rank))
    return RankView(ranks=ordered, detailed=build_view(sources[highest], **options))


@dataclass(frozen=True, kw_only=True, slots=True)
class DiffRow:
    """One quantity in both runs (None where a run does not have it)."""

    section: str
    """``peak``, ``category``, ``phase`` or ``module``."""
    name: str
    a_bytes: int | None
    b_bytes: int | None

    @property
    def delta_bytes(self) -> int:
        """B - A (a missing side counts as 0)."""
        return (self.b_bytes or 0) - (self.a_bytes or 0)

    @property
    def relative(self) -> float | None:
        """delta / A; None when A is zero or absent."""
        return self.delta_bytes / self.a_bytes if self.a_bytes else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        relative = self.relative
        return {
            "section": self.section,
            "name": self.name,
            "a_bytes": self.a_bytes,
            "b_bytes": self.b_bytes,
            "delta_bytes": self.delta_bytes,
            "relative": None if relative is None else round(relative, 6),
        }


@dataclass(frozen=True, kw_only=True, eq=False)
class ViewDiff:
    """Run B against run A: peak levels, then categories at the peak, phase peaks and modules at
    the peak, each section sorted by the size of the difference."""

    a: ViewReport
    b: ViewReport
    rows: tuple[DiffRow, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""

        def side(view: ViewReport) -> dict[str, Any]:
            """Path, engine and peak of one run."""
            return {"path": view.path, "engine": view.report.engine, "peak": view.to_dict()["peak"]}

        return {"a": side(self.a), "b": side(self.b), "rows": [row.to_dict() for row in self.rows]}


def _peak_values(view: ViewReport) -> dict[str, int | None]:
    """The peak at each level the view knows (None where it does not)."""
    levels = view.levels
    return {
        "tensor": levels.tensor_bytes,
        "allocated": levels.allocated_bytes,
        "reserved": levels.reserved_bytes,
        "reserved (replayed)": levels.replayed_reserved_bytes,
    }


def _section(section: str, a: dict[str, int], b: dict[str, int]) -> list[DiffRow]:
    """Rows of one section for every name in either run, largest difference first."""
    names = list(dict.fromkeys([*a, *b]))
    rows = [DiffRow(section=section, name=name, a_bytes=a.get(name), b_bytes=b.get(name)) for name in names]
    return sorted(rows, key=lambda row: -abs(row.delta_bytes))


def diff_views(a: ViewReport, b: ViewReport) -> ViewDiff:
    """Compare two views (build them with a large ``modules`` to compare every module)."""
    peak_a, peak_b = _peak_values(a), _peak_values(b)
    rows = [
        DiffRow(section="peak", name=name, a_bytes=peak_a[name], b_bytes=peak_b[name])
        for name in peak_a
        if peak_a[name] is not None or peak_b[name] is not None
    ]

    def categories(view: ViewReport) -> dict[str, int]:
        """Allocated bytes by category at the view's peak."""
        return {Category(c).value: v for c, v in view.report.breakdown.items() if v}

    def phases(view: ViewReport) -> dict[str, int]:
        """Each phase's allocated high point."""
        return {phase.name: phase.allocated_bytes for phase in view.report.phases}

    rows += _section("category", categories(a), categories(b))
    rows += _section("phase", phases(a), phases(b))
    rows += _section(
        "module", {n or "(no module)": v for n, v in a.modules}, {n or "(no module)": v for n, v in b.modules}
    )
    return ViewDiff(a=a, b=b, rows=tuple(rows))
