"""Terminal and Markdown views of a :class:`MemoryReport`.

The table shows the breakdown at the peak by category with proportional bars,
the phases, the three memory levels (allocated / reserved / device), the fit on
the chosen GPU with its headroom, and the assumptions; ``explain`` adds the terms
that make the peak, level by level, each with when it is alive and its formula, and
after each level's terms their sum: that level's figure (:func:`explained_rows`). Above the tables, the stacked timeline of
:mod:`vramlens.report.timeline_text`; ``ascii_only`` (``--ascii``) draws it, the bars and the
table rules in plain ASCII, as happens by itself on a console that cannot show Unicode blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from vramlens._untrusted import abridge
from vramlens.categories import Category
from vramlens.report.serving_text import serving_lines, vllm_fit_sentence
from vramlens.report.terminal import terminal_console
from vramlens.report.timeline_text import ASCII_TABLE_BOX, Bar, bar, timeline_renderable
from vramlens.result.report import LEVELS, MemoryReport, PhaseMemory
from vramlens.units import format_bytes

__all__ = [
    "add_phase_rows",
    "explained_rows",
    "fit_line",
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


def _breakdown_table(report: MemoryReport, *, ascii_only: bool = False) -> Table:
    peak = report.peak
    table = Table(box=box.SIMPLE_HEAD, title=f"at the peak: {peak.name} ({peak.note})", title_justify="left")
    table.add_column("category")
    table.add_column("memory", justify="right")
    table.add_column("share", justify="right")
    table.add_column("", no_wrap=True)
    rows = [(c.value, b) for c, b in peak.breakdown.items() if b]
    slack, runtime = report.allocator_slack_bytes, report.runtime_bytes
    rows += [(Category.ALLOCATOR_SLACK.value, slack), (Category.RUNTIME.value, runtime)]
    total = report.device_bytes or 1
    for name, value in sorted(rows, key=lambda row: -row[1]):
        table.add_row(
            name.replace("_", " "),
            format_bytes(value),
            f"{value / total:6.1%}",
            _bar(value / total, ascii_only=ascii_only),
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


def _levels_table(report: MemoryReport) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_header=True)
    table.add_column("level")
    table.add_column("peak", justify="right")
    table.add_column("what it is")
    for name, value, what in level_rows(report):
        table.add_row(name, "not recorded" if value is None else format_bytes(value), what)
    return table


def _phases_table(report: MemoryReport, *, ascii_only: bool = False) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title="phases (allocated)", title_justify="left")
    table.add_column("phase")
    table.add_column("allocated", justify="right")
    table.add_column("", no_wrap=True)
    table.add_column("high point")
    add_phase_rows(table, report, report.phases, ascii_only=ascii_only)
    return table


def add_phase_rows(
    table: Table, report: MemoryReport, phases: Sequence[PhaseMemory], *, ascii_only: bool = False
) -> None:
    """One row per phase: its name (marked at the report's peak), allocated bytes, a bar against
    the highest of ``phases`` and its note (``estimate``'s and ``view``'s phase tables)."""
    top = max(phase.allocated_bytes for phase in phases) or 1
    for phase in phases:
        marker = " <- peak" if phase.name == report.peak_phase else ""
        table.add_row(
            abridge(phase.name, 120) + marker,  # a snapshot's annotation: any length
            format_bytes(phase.allocated_bytes),
            _bar(phase.allocated_bytes / top, 16, ascii_only=ascii_only),
            abridge(phase.note, 200),
        )


def fit_line(report: MemoryReport) -> Text:
    """The report's fit sentence (fits / does not fit the GPU, with headroom or shortfall), as the
    CLI prints it and the web page shows it."""
    if report.capacity_bytes is None:
        return Text("no GPU given: pass --gpu (e.g. h100-80gb or 24GiB) to check the fit")
    vllm = vllm_fit_sentence(report)
    if vllm is not None:
        return Text(vllm[0], style="bold green" if vllm[1] else "bold red")
    headroom = report.headroom_bytes or 0
    if report.fits:
        return Text(
            f"fits {report.gpu} ({format_bytes(report.capacity_bytes)}): headroom {format_bytes(headroom)}",
            style="bold green",
        )
    return Text(
        f"does NOT fit {report.gpu} ({format_bytes(report.capacity_bytes)}): short by {format_bytes(-headroom)}",
        style="bold red",
    )


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


def _terms_table(report: MemoryReport) -> Table:
    title = (
        f"what makes the peak ({report.peak_phase}: {report.peak.note})"
        if report.peak.terms
        else "how each term was computed"
    )
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left")
    table.add_column("term")
    table.add_column("memory", justify="right")
    table.add_column("alive")
    table.add_column("formula")
    for name, nbytes, alive, formula, total in explained_rows(report):
        style = "bold" if total else ""
        table.add_row(Text(name, style=style), Text(format_bytes(nbytes), style=style), alive, formula)
    return table


def report_renderable(report: MemoryReport, *, explain: bool = False, ascii_only: bool = False) -> Group:
    """The rich renderable of a report (for the terminal): the tables and the stacked timeline
    (:mod:`vramlens.report.timeline_text`). ``ascii_only``: plain ASCII pictures and table rules
    (also chosen at print time when the console cannot show Unicode blocks)."""
    from vramlens.result.settings import settings_lines

    title = Text(headline(report), style="bold")
    parts: list[object] = [
        title,
        fit_line(report),
        *(Text(line) for line in settings_lines(report)),
        timeline_renderable(report, ascii_only=ascii_only),
        _levels_table(report),
        *(Text(line) for line in safe_lines(report)),
        _breakdown_table(report, ascii_only=ascii_only),
        _phases_table(report, ascii_only=ascii_only),
        *(Text(line) for line in serving_lines(report)),
    ]
    if explain:
        parts.append(_terms_table(report))
    for part in parts if ascii_only else ():
        if isinstance(part, Table):
            part.box = ASCII_TABLE_BOX
    if report.assumptions:
        parts.append(Text("assumptions:", style="bold"))
        parts.extend(Text(f"  - {note}") for note in report.assumptions)
    return Group(*parts)  # type: ignore[arg-type]


def print_report(report: MemoryReport, *, explain: bool = False, ascii_only: bool = False) -> None:
    """Print a report to stdout (the terminal's width on a terminal, 120 columns when piped)."""
    console = terminal_console()
    console.print(report_renderable(report, explain=explain, ascii_only=ascii_only))


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
