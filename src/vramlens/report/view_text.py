"""Terminal tables of ``vramlens view`` and ``vramlens diff`` (rich renderables; printing is the CLI's)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import PurePath
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from vramlens._untrusted import abridge
from vramlens.forensics.diff import RankView, ViewDiff
from vramlens.forensics.live import Leak, LiveAllocation, is_user_frame
from vramlens.forensics.oom import OomForensics
from vramlens.forensics.view import ViewReport
from vramlens.report.terminal import terminal_console
from vramlens.report.text import add_phase_rows
from vramlens.report.timeline_text import Bar, ascii_table_box, bar, timeline_renderable
from vramlens.result.report import MemoryReport
from vramlens.units import format_bytes

__all__ = ["diff_renderable", "print_renderable", "ranks_renderable", "view_headline", "view_renderable"]

_FRAME = re.compile(r"^(?P<file>.*):(?P<line>\d+) in (?P<name>.*)$")


def _bar(share: float, width: int = 24, *, ascii_only: bool = False) -> Bar:
    """A proportional bar of ``share`` (0..1) over ``width`` cells (``#`` in ASCII, and when
    the console cannot show ``█``)."""
    return bar(share, width, ascii_only=ascii_only)


#: Characters of a frame, module or phase name shown in a table cell (longer ones are abridged).
CELL_CHARS = 120


def _frame(frame: str) -> str:
    """``/long/path/train.py:12 in step`` -> ``train.py:12 step`` (abridged to :data:`CELL_CHARS`)."""
    match = _FRAME.match(abridge(frame, 4 * CELL_CHARS))
    if match is None:
        return abridge(frame, CELL_CHARS)
    return abridge(f"{PurePath(match.group('file')).name}:{match.group('line')} {match.group('name')}", CELL_CHARS)


def _stack(frames: tuple[str, ...], lines: int) -> str:
    """The first ``lines`` frames (innermost first), shortened, one per line."""
    return "\n".join(_frame(frame) for frame in frames[:lines]) or "-"


def _age(value: int, unit: str) -> str:
    """An age in the timeline's unit: seconds to nanoseconds, or events."""
    if unit != "ns":
        return f"{value} events"
    for name, scale in (("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if value >= scale:
            return f"{value / scale:.1f} {name}"
    return f"{value} ns"


def _table(title: str, *columns: str) -> Table:
    """A borderless table; its title is printed above it on one line (rich would wrap a title
    to the table's width)."""
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", title_style="bold")
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 or column in ("", "stack", "module") else "right")
    return table


def _group(parts: list[Any], *, ascii_only: bool = False) -> Group:
    """The parts in order, each table's title on a line of its own above it (ASCII rules
    with ``ascii_only``)."""
    laid: list[Any] = []
    for part in parts:
        if isinstance(part, Table) and part.title:
            laid.append(Text(str(part.title), style="bold"))
            part.title = None
        if isinstance(part, Table) and ascii_only:
            part.box = ascii_table_box()
        laid.append(part)
    return Group(*laid)


def _levels(view: ViewReport) -> Table:
    """One row per level the record knows: peaks, and the snapshot's state at dump time."""
    levels = view.levels
    rows: list[tuple[str, int | None, str]] = [
        ("tensor peak", levels.tensor_bytes, "requested bytes of every allocation"),
        ("allocated peak", levels.allocated_bytes, levels.allocated_source),
        ("allocated at dump", levels.allocated_at_dump_bytes, "measured: the snapshot's active blocks"),
        ("allocated (torch)", levels.cuda_max_allocated_bytes, "measured: torch.cuda.max_memory_allocated()"),
        ("reserved peak", levels.reserved_peak_bytes, "measured: segment history or torch.cuda.max_memory_reserved()"),
        ("reserved at dump", levels.reserved_at_dump_bytes, "measured: the snapshot's segments"),
        (
            "reserved (replay)",
            levels.replayed_reserved_bytes,
            "modelled: events replayed through the caching allocator",
        ),
    ]
    table = _table("memory levels", "level", "bytes", "source")
    table.columns[2].justify = "left"
    for name, value, where in rows:
        if value is not None:
            table.add_row(name, format_bytes(value), where)
    if levels.device_bytes is None:
        table.add_row("device", "-", "not recorded (nvidia-smi level unknown)")
    else:
        table.add_row("device", format_bytes(levels.device_bytes), "recorded")
    return table


def _breakdown(view: ViewReport, *, ascii_only: bool = False) -> Table:
    """Allocated bytes by category at the peak, with shares and bars."""
    report = view.report
    table = _table(
        f"at the peak ({report.peak_phase}, event {view.peak_index}), categories {view.categories}",
        "category",
        "allocated",
        "share",
        "",
    )
    total = report.allocated_bytes or 1
    for category, value in sorted(report.breakdown.items(), key=lambda item: -item[1]):
        table.add_row(
            category.value.replace("_", " "),
            format_bytes(value),
            f"{value / total:6.1%}",
            _bar(value / total, ascii_only=ascii_only),
        )
    return table


def _modules(view: ViewReport) -> Table:
    """Allocated bytes at the peak by the module that allocated them."""
    table = _table("by module at the peak (allocating module)", "module", "allocated", "share")
    total = view.report.allocated_bytes or 1
    for name, value in view.modules:
        table.add_row(abridge(name or "(no module)", CELL_CHARS), format_bytes(value), f"{value / total:6.1%}")
    return table


def _phases(view: ViewReport, limit: int = 30, *, ascii_only: bool = False) -> Table:
    """The phases in order; with more than ``limit``, the ``limit`` highest (JSON has them all)."""
    report = view.report
    phases = report.phases
    title = "phases (allocated high point)"
    if len(phases) > limit:
        highest = set(sorted(range(len(phases)), key=lambda i: -phases[i].allocated_bytes)[:limit])
        phases = tuple(phase for i, phase in enumerate(phases) if i in highest)
        title += f": the {limit} highest of {len(report.phases)}"
    table = _table(title, "phase", "allocated", "", "where")
    table.columns[3].justify = "left"
    add_phase_rows(table, report, phases, ascii_only=ascii_only)
    return table


def _allocations(title: str, items: tuple[LiveAllocation, ...], lines: int) -> Table:
    """Live allocations: size, category, module, phase, age and innermost frames."""
    table = _table(title, "size", "category", "module", "phase", "age", "stack")
    for column in table.columns[1:4]:
        column.justify = "left"
    for item in items:
        table.add_row(
            format_bytes(item.nbytes), item.category.value, abridge(item.module or "-", CELL_CHARS),
            abridge(item.phase or "-", CELL_CHARS),
            _age(item.age, item.time_unit), _stack(item.stack, lines),
        )  # fmt: skip
    return table


def _leaks(view: ViewReport, lines: int) -> Any:
    """The leaks table, or one line saying why there is none."""
    if not view.steps:
        return Text(f"leaks: not checked ({view.steps_rule})")
    if not view.leaks:
        return Text(f"leaks: none over {len(view.steps)} steps ({view.steps_rule})")
    shown = f", the {len(view.leaks)} largest of {view.leaks_found}" if view.leaks_found > len(view.leaks) else ""
    table = _table(
        f"possible leaks over {len(view.steps)} steps ({view.steps_rule}{shown})",
        "per step",
        "live",
        "count",
        "survived",
        "category",
        "stack",
    )
    table.columns[4].justify = "left"
    leak: Leak
    for leak in view.leaks:
        where = _stack(leak.stack, lines) if leak.stack else abridge(leak.module or "-", CELL_CHARS)
        table.add_row(
            format_bytes(leak.bytes_per_step), format_bytes(leak.nbytes), str(leak.count),
            f"{leak.oldest_steps} steps", leak.category.value, where,
        )  # fmt: skip
    return table


def _oom(oom: OomForensics, number: int, lines: int) -> list[Any]:
    """One OOM: what was asked and free, the cache, what was live, and the changes that free memory."""
    free = "?" if oom.device_free_bytes is None else format_bytes(oom.device_free_bytes)
    where = f" in {oom.phase}" if oom.phase else ""
    head = (
        f"OOM {number}: requested {format_bytes(oom.requested_bytes)} with {free} free on the device, "
        f"after event {oom.event}{where}; allocated {format_bytes(oom.allocated_bytes)} live"
    )
    parts: list[Any] = [Text(head, style="bold red")]
    if oom.cached_bytes is not None and oom.reserved_bytes is not None:
        parts.append(
            Text(
                f"  reserved {format_bytes(oom.reserved_bytes)}, cached (unallocated) {format_bytes(oom.cached_bytes)} [{oom.cached_source}]"
            )
        )
    if oom.shortfall_bytes is not None:
        parts.append(
            Text(f"  short by {format_bytes(oom.shortfall_bytes)} (the segment it needed minus the free bytes)")
        )
    live = ", ".join(
        f"{c.value} {format_bytes(b)}" for c, b in sorted(oom.breakdown.items(), key=lambda item: -item[1])
    )
    parts.append(Text(f"  live: {live or 'nothing'}"))
    if oom.top_allocations:
        parts.append(_allocations("  largest live allocations", oom.top_allocations, lines))
    table = _table(
        "  changes that would have freed memory (avoiding ones first, cheapest first)",
        "saves",
        "avoids",
        "change",
        "basis",
    )
    for column in table.columns[2:]:
        column.justify = "left"
        column.overflow = "fold"
    for item in oom.suggestions:
        verdict = {True: "yes", False: "no", None: "?"}[item.avoids_oom]
        table.add_row(format_bytes(item.saves_bytes), verdict, item.change, item.basis)
    parts.append(table)
    return parts


def view_headline(report: MemoryReport, source_format: object) -> str:
    """``vramlens view``'s first line: a record's peak is its measured allocated peak."""
    return (
        f"{report.model} - {report.engine} ({source_format}): peak {format_bytes(report.allocated_bytes)} "
        f"allocated in {report.peak_phase}"
    )


def user_frames_only(view: ViewReport) -> ViewReport:
    """``view`` with every stack cut to the user's own frames (no site-packages, no standard
    library): what ``vramlens view --user-frames`` shows."""

    def cut(item: Any) -> Any:
        return dataclasses.replace(item, stack=tuple(f for f in item.stack if is_user_frame(f)))

    ooms = tuple(
        dataclasses.replace(oom, top_allocations=tuple(cut(a) for a in oom.top_allocations)) for oom in view.ooms
    )
    return dataclasses.replace(
        view,
        top_allocations=tuple(cut(a) for a in view.top_allocations),
        leaks=tuple(cut(leak) for leak in view.leaks),
        ooms=ooms,
    )


def view_renderable(
    view: ViewReport, *, stack_lines: int = 3, ascii_only: bool = False, user_frames: bool = False
) -> Group:
    """Everything ``vramlens view`` shows for one record, the stacked timeline first;
    ``ascii_only``: plain ASCII pictures and table rules; ``user_frames``: stacks cut to the
    user's own frames (:func:`user_frames_only`)."""
    if user_frames:
        view = user_frames_only(view)
    report = view.report
    parts: list[Any] = [
        Text(view_headline(report, view.format), style="bold"),
        timeline_renderable(report, ascii_only=ascii_only),
        Text(""),
        _levels(view),
        _breakdown(view, ascii_only=ascii_only),
    ]
    if any(name for name, _ in view.modules):
        parts.append(_modules(view))
    parts.append(_phases(view, ascii_only=ascii_only))
    if view.identities:
        parts.append(_allocations("largest allocations live at the peak", view.top_allocations, stack_lines))
    parts.append(_leaks(view, stack_lines))
    for number, oom in enumerate(view.ooms, start=1):
        parts.extend(_oom(oom, number, stack_lines))
    parts.append(Text("assumptions:", style="bold"))
    parts.extend(Text(f"  - {note}") for note in report.assumptions)
    return _group(parts, ascii_only=ascii_only)


def ranks_renderable(
    ranks: RankView, *, stack_lines: int = 3, ascii_only: bool = False, user_frames: bool = False
) -> Group:
    """Per-rank peaks and skew, then the detailed view of the highest rank."""
    table = _table("per-rank peaks (allocated)", "rank", "allocated", "tensor", "phase", "file")
    for column in table.columns[3:]:
        column.justify = "left"
    for rank in ranks.ranks:
        tensor = "-" if rank.tensor_bytes is None else format_bytes(rank.tensor_bytes)
        table.add_row(str(rank.rank), format_bytes(rank.allocated_bytes), tensor, rank.phase, rank.path)
    skew = Text(
        f"skew: {format_bytes(ranks.skew_bytes)} (max - min), max/median {ranks.max_over_median:.3f}; "
        f"details of rank {ranks.detailed_rank} (the highest):",
        style="bold",
    )
    detailed = view_renderable(ranks.detailed, stack_lines=stack_lines, ascii_only=ascii_only, user_frames=user_frames)
    return _group([table, skew, detailed], ascii_only=ascii_only)


def _diff_cells(section: str, name: str, a: int | None, b: int | None) -> tuple[str, ...]:
    delta = (b or 0) - (a or 0)
    relative = f"{delta / a:+.1%}" if a else "-"
    return (
        section, name, "-" if a is None else format_bytes(a), "-" if b is None else format_bytes(b),
        format_bytes(delta), relative,
    )  # fmt: skip


def diff_renderable(diff: ViewDiff, *, top: int = 20) -> Group:
    """B against A per level, then per category, phase and module: each of those sections its
    ``top`` rows with the largest differences, a row summing the ones left out, and its total."""
    table = _table(f"B = {diff.b.path} against A = {diff.a.path}", "section", "name", "A", "B", "B - A", "change")
    table.columns[1].justify = "left"
    sections: dict[str, list[Any]] = {}
    for row in diff.rows:
        sections.setdefault(row.section, []).append(row)
    for section, rows in sections.items():
        shown = rows if section == "peak" else rows[:top]
        for row in shown:
            table.add_row(*_diff_cells(section, row.name, row.a_bytes, row.b_bytes))
        if section == "peak":
            continue
        hidden = rows[len(shown) :]
        if hidden:
            rest_a, rest_b = sum(r.a_bytes or 0 for r in hidden), sum(r.b_bytes or 0 for r in hidden)
            table.add_row(*_diff_cells(section, f"({len(hidden)} more; --top to show)", rest_a, rest_b))
        total_a, total_b = sum(r.a_bytes or 0 for r in rows), sum(r.b_bytes or 0 for r in rows)
        table.add_row(*_diff_cells(section, "total", total_a, total_b), style="bold")
    return _group([table])


def print_renderable(renderable: Any) -> None:
    """Print to stdout (the terminal's width on a terminal, 120 columns when piped)."""
    terminal_console().print(renderable)
