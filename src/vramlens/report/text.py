"""Terminal and Markdown views of a :class:`MemoryReport`.

The table shows the breakdown at the peak by category with proportional bars,
the phases, the three memory levels (allocated / reserved / device), the fit on
the chosen GPU with its headroom, and the assumptions; ``explain`` adds the terms
that make the peak, level by level, each with when it is alive and its formula, and
after each level's terms their sum: that level's figure (:func:`explained_rows`). Above the tables, the stacked timeline of
:mod:`vramlens.report.timeline_text`; ``ascii_only`` (``--ascii``) draws it, the bars and the
table rules in plain ASCII, as happens by itself on a console that cannot show Unicode blocks.

A report is described as :mod:`vramlens.report.blocks` (lines, tables, the picture): printed to
a pipe or a file they are laid out as plain text without importing rich, on a terminal rich
prints them with colors (:func:`print_report`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vramlens._untrusted import abridge
from vramlens.categories import Category
from vramlens.report.blocks import Block, Cell, Column, Line, TableBlock, TimelineBlock, plain_lines, to_rich
from vramlens.report.points import report_points
from vramlens.report.serving_text import serving_lines, vllm_fit_sentence
from vramlens.report.timeline_text import Bar, bar
from vramlens.result.report import LEVELS, MemoryReport, PhaseMemory
from vramlens.units import format_bytes

if TYPE_CHECKING:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

__all__ = [
    "add_phase_rows",
    "explained_rows",
    "fit_line",
    "fit_sentence",
    "phase_rows",
    "report_blocks",
    "headline",
    "level_rows",
    "safe_lines",
    "markdown_report",
    "print_report",
    "report_renderable",
    "serving_lines",
]

_BAR_WIDTH = 28


def _bar(share: float, width: int = _BAR_WIDTH, *, ascii_only: bool = False) -> Bar:
    """``█`` cells (``#`` in ASCII, and when the console cannot show ``█``)."""
    return bar(share, width, ascii_only=ascii_only)


def _breakdown_table(report: MemoryReport, *, ascii_only: bool = False) -> TableBlock:
    peak = report.peak
    columns: tuple[Column, ...] = (Column(header="category"), Column(header="memory", justify="right"))
    columns += (Column(header="share", justify="right"), Column(header="", no_wrap=True))
    table = TableBlock(columns=columns, title=f"at the peak: {peak.name} ({peak.note})", ascii_only=ascii_only)
    rows = [(c.value, b) for c, b in peak.breakdown.items() if b]
    slack, runtime = report.allocator_slack_bytes, report.runtime_bytes
    rows += [(Category.ALLOCATOR_SLACK.value, slack), (Category.RUNTIME.value, runtime)]
    total = report.device_bytes or 1
    for name, value in sorted(rows, key=lambda row: -row[1]):
        table.rows.append(
            (
                name.replace("_", " "),
                format_bytes(value),
                f"{value / total:6.1%}",
                _bar(value / total, ascii_only=ascii_only),
            )
        )
    return table


def headline(report: MemoryReport) -> str:
    """The report's first line: model, engine and the device-level peak per GPU."""
    device = format_bytes(report.device_bytes) if report.device_known else "not recorded"
    return f"{report.model} - {report.engine}: peak {device} per GPU (device level)"


def level_rows(report: MemoryReport) -> list[tuple[str, int | None, str]]:
    """The three levels as (name, bytes or None when not recorded, what it is)."""
    device = report.device_bytes if report.device_known else None
    return [
        ("allocated", report.allocated_bytes, "torch.cuda.max_memory_allocated()"),
        ("reserved", report.reserved_bytes, "torch.cuda.max_memory_reserved(): + allocator slack"),
        ("device", device, "nvidia-smi: + CUDA context" + (", NCCL" if "nccl" in report.runtime else "")),
    ]


def safe_lines(report: MemoryReport) -> list[str]:
    """The safe figures and their margins (estimates), as the fit compares them with a GPU."""
    safe = report.safe
    if safe is None:
        return []
    lines = [
        f"safe (at least 95% of public measurements at or below): allocated {format_bytes(safe.allocated_bytes)}, "
        f"reserved {format_bytes(safe.reserved_bytes)}, device {format_bytes(safe.device_bytes)}"
        + (" - the fit uses the safe device figure" if report.capacity_bytes is not None else "")
    ]
    lines += [
        f"  + {margin.kind} ({margin.level}): {format_bytes(margin.bytes)} - {margin.source}"
        for margin in safe.margins
        if margin.bytes
    ]
    return lines


def _levels_table(report: MemoryReport, *, ascii_only: bool = False) -> TableBlock:
    columns = (Column(header="level"), Column(header="peak", justify="right"), Column(header="what it is"))
    table = TableBlock(columns=columns, ascii_only=ascii_only)
    for name, value, what in level_rows(report):
        table.rows.append((name, "not recorded" if value is None else format_bytes(value), what))
    return table


def _phases_table(report: MemoryReport, *, ascii_only: bool = False) -> TableBlock:
    columns: tuple[Column, ...] = (Column(header="phase"), Column(header="allocated", justify="right"))
    columns += (Column(header="", no_wrap=True), Column(header="high point"))
    table = TableBlock(columns=columns, title="phases (allocated)", ascii_only=ascii_only)
    table.rows.extend(phase_rows(report, report.phases, ascii_only=ascii_only))
    return table


def phase_rows(
    report: MemoryReport, phases: Sequence[PhaseMemory], *, ascii_only: bool = False
) -> list[tuple[str, str, Bar, str]]:
    """One row per phase: its name (marked at the report's peak), allocated bytes, a bar against
    the highest of ``phases`` and its note (``estimate``'s and ``view``'s phase tables)."""
    top = max(phase.allocated_bytes for phase in phases) or 1
    return [
        (
            abridge(phase.name, 120) + (" <- peak" if phase.name == report.peak_phase else ""),  # any length
            format_bytes(phase.allocated_bytes),
            _bar(phase.allocated_bytes / top, 16, ascii_only=ascii_only),
            abridge(phase.note, 200),
        )
        for phase in phases
    ]


def add_phase_rows(
    table: Table, report: MemoryReport, phases: Sequence[PhaseMemory], *, ascii_only: bool = False
) -> None:
    """:func:`phase_rows` added to a rich table."""
    for row in phase_rows(report, phases, ascii_only=ascii_only):
        table.add_row(*row)


def fit_sentence(report: MemoryReport) -> tuple[str, str]:
    """The report's fit sentence (fits / does not fit the GPU, with headroom or shortfall) and its
    style, as the CLI prints it and the web page shows it."""
    if report.capacity_bytes is None:
        return "no GPU given: pass --gpu (e.g. h100-80gb or 24GiB) to check the fit", ""
    vllm = vllm_fit_sentence(report)
    if vllm is not None:
        return vllm[0], "bold green" if vllm[1] else "bold red"
    headroom = report.headroom_bytes or 0
    if report.fits:
        capacity = format_bytes(report.capacity_bytes)
        return f"fits {report.gpu} ({capacity}): headroom {format_bytes(headroom)}", "bold green"
    capacity = format_bytes(report.capacity_bytes)
    return f"does NOT fit {report.gpu} ({capacity}): short by {format_bytes(-headroom)}", "bold red"


def fit_line(report: MemoryReport) -> Text:
    """:func:`fit_sentence` as a rich ``Text``."""
    from rich.text import Text

    text, style = fit_sentence(report)
    return Text(text, style=style)


def explained_rows(report: MemoryReport) -> list[tuple[str, int, str, str, bool]]:
    """(name, bytes, alive, formula, is a level's sum) rows of ``--explain``: the peak's terms, level
    by level, each level closed by the sum of every term above it (which is that level's figure).
    A report without peak terms (hand-built, simulated, measured) lists its terms as they are."""
    if not report.peak.terms:
        return [(term.name, term.bytes, term.alive, term.formula, False) for term in report.terms]
    rows: list[tuple[str, int, str, str, bool]] = []
    shown = 0
    for level in LEVELS:
        terms = report.peak_terms(level)
        rows += [(term.name, term.bytes, term.alive, term.formula, False) for term in terms[shown:]]
        shown = len(terms)
        rows.append((f"= {level} peak", sum(term.bytes for term in terms), "", "the sum of the terms above", True))
    return rows


def _terms_table(report: MemoryReport, *, ascii_only: bool = False) -> TableBlock:
    title = (
        f"what makes the peak ({report.peak_phase}: {report.peak.note})"
        if report.peak.terms
        else "how each term was computed"
    )
    columns = (Column(header="term"), Column(header="memory", justify="right"), Column(header="alive"))
    table = TableBlock(columns=(*columns, Column(header="formula")), title=title, ascii_only=ascii_only)
    for name, nbytes, alive, formula, total in explained_rows(report):
        style = "bold" if total else ""
        row: tuple[Cell, ...] = ((name, style), (format_bytes(nbytes), style), alive, formula)
        table.rows.append(row)
    return table


def report_blocks(report: MemoryReport, *, explain: bool = False, ascii_only: bool = False) -> list[Block]:
    """What the terminal shows of a report, in order: the headline, the fit, the settings, the
    stacked timeline (:mod:`vramlens.report.timeline_text`), the tables and the assumptions.
    ``ascii_only``: plain ASCII pictures and table rules (also chosen at print time when the
    console cannot show Unicode blocks)."""
    from vramlens.result.settings import settings_lines

    fit, fit_style = fit_sentence(report)
    blocks: list[Block] = [
        Line(text=headline(report), style="bold"),
        Line(text=fit, style=fit_style),
        *(Line(text=line) for line in settings_lines(report)),
        TimelineBlock(points=report_points(report), ascii_only=ascii_only),
        _levels_table(report, ascii_only=ascii_only),
        *(Line(text=line) for line in safe_lines(report)),
        _breakdown_table(report, ascii_only=ascii_only),
        _phases_table(report, ascii_only=ascii_only),
        *(Line(text=line) for line in serving_lines(report)),
    ]
    if explain:
        blocks.append(_terms_table(report, ascii_only=ascii_only))
    if report.assumptions:
        blocks.append(Line(text="assumptions:", style="bold"))
        blocks.extend(Line(text=f"  - {note}") for note in report.assumptions)
    return blocks


def report_renderable(report: MemoryReport, *, explain: bool = False, ascii_only: bool = False) -> Group:
    """The rich renderable of a report (for the terminal): :func:`report_blocks` in rich."""
    from rich.console import Group

    return Group(*(to_rich(block) for block in report_blocks(report, explain=explain, ascii_only=ascii_only)))


#: Environment variables that make rich print colors or pick a width of its own on a pipe.
_RICH_ENVIRONMENT = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


def _plain_stdout() -> bool:
    """Whether stdout takes rich's output without colors at the piped width: not a terminal, a
    UTF-8 stream, not a notebook, and nothing in the environment that makes rich color a pipe."""
    stream = sys.stdout
    encoding = (getattr(stream, "encoding", None) or "utf-8").lower()
    if stream.isatty() or not encoding.startswith("utf") or sys.platform == "win32":
        return False
    return not any(os.environ.get(name) for name in _RICH_ENVIRONMENT) and "ipykernel" not in sys.modules


def print_report(report: MemoryReport, *, explain: bool = False, ascii_only: bool = False) -> None:
    """Print a report to stdout (the terminal's width on a terminal, 120 columns when piped):
    plain text without rich when stdout is piped (:func:`vramlens.report.blocks.plain_lines`), rich
    with colors otherwise."""
    from vramlens.report.console import PIPED_WIDTH

    blocks = report_blocks(report, explain=explain, ascii_only=ascii_only)
    lines = plain_lines(blocks, PIPED_WIDTH) if _plain_stdout() else None
    if lines is not None:
        sys.stdout.write("".join(line + "\n" for line in lines))
        return
    from rich.console import Group

    from vramlens.report.terminal import terminal_console

    terminal_console().print(Group(*(to_rich(block) for block in blocks)))


def markdown_report(report: MemoryReport, *, explain: bool = False) -> str:
    """A Markdown version of the report (for issues, PRs and notebooks)."""
    lines = [f"### {report.model}: {format_bytes(report.device_bytes)} per GPU", ""]
    if report.capacity_bytes is not None:
        headroom = report.headroom_bytes or 0
        capacity = f"{report.gpu} ({format_bytes(report.capacity_bytes)})"
        verdict = (
            f"fits {capacity}, headroom {format_bytes(headroom)}"
            if report.fits
            else f"does **not** fit {capacity}: short by {format_bytes(-headroom)}"
        )
        vllm = vllm_fit_sentence(report)
        if vllm is not None:
            verdict = vllm[0].replace("NOT", "**not**")
        lines += [verdict, ""]
    from vramlens.result.settings import settings_lines

    settings = settings_lines(report)
    if settings:
        lines += [settings[0] + "  ", settings[1].strip(), ""]
    lines += ["| level | peak |", "|---|---:|"]
    lines += [
        f"| {name} | {format_bytes(value)} |"
        for name, value in (
            ("allocated", report.allocated_bytes),
            ("reserved", report.reserved_bytes),
            ("device", report.device_bytes),
        )
    ]
    lines += [
        "",
        f"Breakdown at the peak ({report.peak_phase}: {report.peak.note}):",
        "",
        "| category | memory |",
        "|---|---:|",
    ]
    lines += [
        f"| {c.value} | {format_bytes(b)} |"
        for c, b in sorted(report.breakdown.items(), key=lambda item: -item[1])
        if b
    ]
    lines += ["", "| phase | allocated |", "|---|---:|"]
    lines += [f"| {p.name} | {format_bytes(p.allocated_bytes)} |" for p in report.phases]
    serving = serving_lines(report)
    if serving:
        lines += ["", *serving]
    if explain:
        lines += ["", "| term | memory | alive | formula |", "|---|---:|---|---|"]
        lines += [
            f"| {f'**{name}**' if total else name} | {format_bytes(nbytes)} | {alive} | {formula} |"
            for name, nbytes, alive, formula, total in explained_rows(report)
        ]
    if report.assumptions:
        lines += ["", "Assumptions:", ""] + [f"- {note}" for note in report.assumptions]
    return "\n".join(lines) + "\n"
