"""The terminal timeline (report/timeline_text.py): known shapes give known columns, the
capacity line and the peak marker sit where the numbers say, labels fit, ASCII is ASCII."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rich.cells import cell_len
from rich.console import Console

from vramlens.categories import Category
from vramlens.cli.app import main
from vramlens.estimator import estimate
from vramlens.report.series import StackedSeries, report_series, timeline_series
from vramlens.report.text import report_renderable
from vramlens.report.timeline_text import (
    TerminalTimeline,
    layout_timeline,
    needs_ascii,
    render_timeline,
    timeline_text,
)
from vramlens.result.report import MemoryReport
from vramlens.result.timeline import CATEGORY_ORDER, TimelineBuilder
from vramlens.trace.timeline_io import save_timeline
from vramlens.units import GiB

PARAMS, ACT = Category.PARAMETERS, Category.ACTIVATIONS
NAMES = ("load", "forward", "backward", "optimizer_step")


def phase_series(
    params: list[int], acts: list[int], *, capacity: int | None = None, names: tuple[str, ...] = NAMES
) -> StackedSeries:
    """An estimate-like series: one point per phase, parameters below activations."""
    values = np.array([params, acts], dtype=np.int64)
    total = values.sum(axis=0)
    peak = int(np.argmax(total))
    return StackedSeries(
        x=np.arange(len(params), dtype=np.float64),
        x_unit="phase",
        categories=(PARAMS, ACT),
        values=values,
        total=total,
        phases=tuple((name, float(i), float(i)) for i, name in enumerate(names)),
        peak_index=peak,
        peak_bytes=int(total[peak]),
        capacity_bytes=capacity,
        level="allocated",
        events=len(params),
        source_index=np.arange(len(params), dtype=np.int64),
    )


def event_series(totals: list[int], x: list[float] | None = None, unit: str = "event") -> StackedSeries:
    """One category (activations) at the given points."""
    total = np.array(totals, dtype=np.int64)
    return StackedSeries(
        x=np.array(x if x is not None else range(len(totals)), dtype=np.float64),
        x_unit=unit,
        categories=(ACT,),
        values=total[None, :].copy(),
        total=total,
        phases=(),
        peak_index=int(np.argmax(total)),
        peak_bytes=int(total.max()),
        capacity_bytes=None,
        level="tensor",
        events=len(totals),
        source_index=np.arange(len(totals), dtype=np.int64),
    )


#: 2, 4, 8 and 3 GiB: with 8 rows and no capacity, one row is 1 GiB.
SHAPE = phase_series([2 * GiB] * 4, [0, 2 * GiB, 6 * GiB, 1 * GiB])
#: Labels "8.0 GiB" are 7 cells, then a space and the axis: the plot starts at cell 9.
WIDTH, PLOT, LEFT = 49, 40, 9


def plot_columns(lines: list[str], height: int) -> list[str]:
    """Each plot column's characters, bottom row first (lines[0] is the title)."""
    rows = [line.ljust(LEFT + PLOT)[LEFT : LEFT + PLOT] for line in lines[1 : 1 + height]]
    return ["".join(row[column] for row in reversed(rows)) for column in range(PLOT)]


def plain(series: StackedSeries, *, width: int = WIDTH, height: int = 8, ascii_only: bool = False) -> list[str]:
    return [line.plain for line in render_timeline(series, width=width, height=height, ascii_only=ascii_only)]


def test_layout_of_a_known_shape() -> None:
    layout = layout_timeline(SHAPE, width=WIDTH, height=8)
    assert (layout.plot_width, layout.label_width, layout.scale_bytes) == (PLOT, 7, 8 * GiB)
    assert list(layout.shown) == [0] * 10 + [1] * 10 + [2] * 10 + [3] * 10  # 10 columns per phase
    assert list(layout.levels) == [16] * 10 + [32] * 10 + [64] * 10 + [24] * 10  # eighths of a row
    assert layout.peak_column == 25  # the middle of the peak phase's columns 20..29
    assert layout.capacity_row is None
    # Parameters (index 0) fill rows 0-1 of every column, activations (1) the rest.
    assert [row[25] for row in layout.cells] == [0, 0, 1, 1, 1, 1, 1, 1]
    assert [row[0] for row in layout.cells] == [0, 0, -1, -1, -1, -1, -1, -1]


def test_columns_heights_colors_and_the_peak_marker() -> None:
    lines = plain(SHAPE)
    columns = plot_columns(lines, 8)
    heights = [column.count("█") for column in columns]
    assert heights == [2] * 10 + [4] * 10 + [8] * 10 + [3] * 10  # proportional to 2, 4, 8, 3 GiB
    marker = next(line for line in lines if "▲" in line)
    assert marker.index("▲") - LEFT == 25 and heights[25] == max(heights)
    assert "▲ peak 8.00 GiB" in marker
    assert lines[1].startswith("8.0 GiB ┤") and lines[5].startswith("4.0 GiB ┤")  # top and middle labels
    assert lines[9].startswith("    0 B └")
    ascii_columns = plot_columns(plain(SHAPE, ascii_only=True), 8)
    assert [ascii_columns[i].rstrip() for i in (0, 10, 20, 30)] == ["PP", "PPAA", "PPAAAAAA", "PPA"]


def test_eighth_blocks_top_the_columns() -> None:
    series = phase_series([2 * GiB, 8 * GiB], [GiB // 2, 0], names=("a", "b"))  # 2.5 and 8 GiB
    columns = plot_columns(plain(series), 8)
    assert columns[0].rstrip() == "██▄"  # 2.5 rows: two full cells and a half block
    assert columns[-1] == "█" * 8


def test_the_capacity_line_sits_on_its_row() -> None:
    series = phase_series([2 * GiB] * 4, [0, 2 * GiB, 6 * GiB, GiB], capacity=6 * GiB)
    layout = layout_timeline(series, width=WIDTH, height=8)
    assert layout.capacity_row == 5  # ceil(6 GiB / 8 GiB x 8 rows) - 1: the row from 5 to 6 GiB
    lines = plain(series)
    row = lines[1 + 8 - 1 - 5]
    assert row.startswith("6.0 GiB ┤") and row[LEFT:] == "━" * PLOT  # drawn through the columns too
    assert "━ GPU capacity 6.00 GiB" in "\n".join(lines)
    roomy = phase_series([2 * GiB] * 4, [0, 2 * GiB, 6 * GiB, GiB], capacity=16 * GiB)
    layout = layout_timeline(roomy, width=WIDTH, height=8)
    assert (layout.scale_bytes, layout.capacity_row) == (16 * GiB, 7)
    assert plot_columns(plain(roomy), 8)[25].count("█") == 4  # half the height: the scale is the capacity


def test_a_capacity_far_above_the_peak_is_left_off_the_scale() -> None:
    series = phase_series([GiB, GiB], [GiB, 3 * GiB], capacity=80 * GiB, names=("a", "b"))  # peak 4 GiB
    layout = layout_timeline(series, width=WIDTH, height=8)
    assert (layout.scale_bytes, layout.capacity_row) == (4 * GiB, None)
    lines = plain(series, width=100)
    assert "━" not in "\n".join(lines[1:9]) and lines[1].startswith("4.0 GiB ┤")
    assert "GPU capacity 80.00 GiB, above the scale (20x the peak)" in lines[-1]
    columns = plot_columns(plain(series, ascii_only=True), 8)  # rows of 0.5 GiB: 1 + 1 and 1 + 3 GiB
    assert (columns[0].rstrip(), columns[-1]) == ("PPAA", "PPAAAAAA")
    four_times = replace(series, capacity_bytes=16 * GiB)  # exactly 4x the peak: still drawn, on the top row
    assert layout_timeline(four_times, width=WIDTH, height=10).capacity_row == 9


def test_a_peak_over_the_capacity_shows_both_and_the_overflow() -> None:
    series = phase_series([2 * GiB] * 4, [0, 2 * GiB, 6 * GiB, GiB], capacity=5 * GiB)
    lines = plain(series, width=80)
    assert lines[1].startswith("8.0 GiB ┤")  # the scale reaches the peak ...
    capacity_line = lines[1 + 8 - 1 - 4]  # ... and the capacity (5 GiB) is on row 4
    assert capacity_line.startswith("5.0 GiB ┤") and set(capacity_line[LEFT:].strip()) == {"━"}
    left = 80 - 9
    columns = [row.ljust(80)[LEFT:] for row in lines[1:9]]
    peak = next(line for line in lines if "▲" in line).index("▲") - LEFT
    assert all(row[peak] == "█" for row in columns[:3])  # three rows above the line: the overflow
    assert "peak 8.00 GiB, 3.00 GiB over capacity" in "\n".join(lines) and left > 0


def test_a_timeline_column_shows_the_highest_point_of_its_slice_and_carries_the_state() -> None:
    series = event_series([5 * GiB, 9 * GiB, 3 * GiB, 7 * GiB])  # labels like "9.0 GiB": the plot starts at 9
    assert list(layout_timeline(series, width=9 + 2, height=4).shown) == [1, 3]  # 2 events per column
    assert list(layout_timeline(series, width=9 + 8, height=4).shown) == [0, 0, 1, 1, 2, 2, 3, 3]
    sparse = event_series([4 * GiB, 8 * GiB], x=[0.0, 10.0], unit="ms")  # nothing between 0 and 10 ms
    layout = layout_timeline(sparse, width=9 + 10, height=4)
    assert layout.plot_width == 10 and list(layout.shown) == [0] * 9 + [1]
    text = "\n".join(plain(sparse, width=40))
    assert "0 ms" in text and "memory over time" in text


def test_the_peak_of_a_long_timeline_is_exact_and_marked() -> None:
    builder = TimelineBuilder(time_unit="ns")
    code = CATEGORY_ORDER.index(ACT)
    phase = builder.code("phase", "train")
    for k in range(25_000):  # 1000 B allocated and freed, once 1 MiB (events 31_336 and 31_337)
        size = 2**20 if k == 15_668 else 1000
        builder.append(2 * k * 1000, size, code, k, phase, -1, -1)
        builder.append((2 * k + 1) * 1000, -size, code, k, phase, -1, -1)
    builder.append(50_000 * 1000, 4096, code, 10**6, phase, -1, -1)
    series = timeline_series(builder.build(), max_points=400)
    assert series.peak_bytes == 2**20 and series.source_index[series.peak_index] == 31_336
    lines = plain(series, width=70, height=10)
    marker = next(line for line in lines if "▲" in line)
    assert f"peak {series.peak_bytes / 2**20:.2f} MiB" in marker
    column = marker.index("▲")
    assert lines[1][column] == "█" and sum(line[column : column + 1] == "█" for line in lines[1:11]) == 10


def test_phase_names_in_order_cut_to_fit_and_never_overlapping() -> None:
    names = ("tokenize_and_load", "forward", "backward_with_recompute", "optimizer_step", "all_reduce")
    series = phase_series([GiB] * 5, [GiB] * 5, names=names)
    for width in (40, 60, 100, 160):
        lines = plain(series, width=width)
        assert all(cell_len(line) <= width for line in lines)
        row = next(line for line in lines if "forward" in line or "forw…" in line or "tok" in line)
        words = row.split()
        assert len(words) >= 3
        position = [names.index(next(n for n in names if n.startswith(w.rstrip("…")))) for w in words]
        assert position == sorted(position)  # in order, one word per phase: no two run together
        assert all(w in names or (w.endswith("…") and len(w) >= 4) for w in words)
    assert plain(series, width=160)[10].split() == list(names)  # all whole when there is room


def test_ascii_output_is_printable_ascii_and_uses_the_palette_fills() -> None:
    series = phase_series([2 * GiB] * 4, [0, 2 * GiB, 6 * GiB, GiB], capacity=5 * GiB)
    for width in (30, 49, 120):
        text = "\n".join(plain(series, width=width, ascii_only=True))
        assert all(" " <= char <= "~" for char in text.replace("\n", ""))
        assert "P parameters" in text and "A activations" in text and "= GPU capacity" in text
        assert "^" in text and "+--" in text and "==" in text


def test_width_is_respected_for_every_kind_of_series() -> None:
    report = estimate({"model": "llama-3.2-1b", "gpu": "a100-80gb"})
    many = event_series(list(range(1, 3000)), x=[i * 0.5 for i in range(1, 3000)], unit="ms")
    for series in (report_series(report), SHAPE, many):
        for width in (12, 20, 33, 80, 211):
            for ascii_only in (False, True):
                lines = plain(series, width=width, ascii_only=ascii_only)
                assert max(cell_len(line) for line in lines) <= width, (width, ascii_only)


def render(renderable: object, *, width: int = 100, encoding: str = "utf-8") -> str:
    buffer = io.BytesIO()
    stream = io.TextIOWrapper(buffer, encoding=encoding, errors="strict")
    console = Console(file=stream, width=width, color_system=None, force_terminal=False, highlight=False)
    console.print(renderable)
    stream.flush()
    return buffer.getvalue().decode(encoding)


@pytest.fixture(scope="module")
def report() -> MemoryReport:
    return estimate({"model": "llama-3.2-1b", "gpu": "a100-80gb"})


def test_an_estimate_report_shows_its_timeline(report: MemoryReport) -> None:
    text = render(report_renderable(report))
    lines = text.splitlines()
    start = lines.index("memory by phase (allocated bytes, stacked by category)")
    assert max(cell_len(line) for line in lines[start : start + 16]) <= 100
    names = next(line for line in lines if "forward" in line and "backward" in line).split()
    assert names == [phase.name for phase in report.phases]
    assert f"▲ peak {'47.76 GiB'}" in text and report.peak_phase == "backward"
    assert "79.2 GiB ┤━━━" in text  # the capacity of an A100 80GB (79.15 GiB) on the top row


def test_a_console_that_cannot_encode_blocks_gets_ascii(report: MemoryReport) -> None:
    assert not needs_ascii(Console(file=io.TextIOWrapper(io.BytesIO(), encoding="utf-8")))
    for encoding in ("ascii", "cp1252", "latin-1"):
        assert needs_ascii(Console(file=io.TextIOWrapper(io.BytesIO(), encoding=encoding)))
    assert needs_ascii(Console(file=io.StringIO(), legacy_windows=True))
    text = render(report_renderable(report), encoding="ascii")  # would raise on a block character
    assert "P parameters" in text and "#####" in text
    picture = render(TerminalTimeline(series=SHAPE, width=WIDTH), encoding="ascii")
    assert "PPAAAAAA" not in picture and "^ peak 8.00 GiB" in picture


def test_ascii_only_report_is_pure_ascii(report: MemoryReport) -> None:
    text = render(report_renderable(report, ascii_only=True))
    assert all(" " <= char <= "~" for char in text.replace("\n", ""))
    assert "^ peak 47.76 GiB" in text and "##########" in text  # the timeline and the breakdown bars
    assert timeline_text(report, width=60, ascii_only=True).splitlines()[0].startswith("memory by phase")


def test_cli_estimate_ascii_draws_the_ascii_timeline(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    assert main(["estimate", "llama-3.2-1b", "--gpu", "a100-80gb", "--ascii"]) == 0
    out = capsys.readouterr().out
    assert all(" " <= char <= "~" for char in out.replace("\n", ""))
    lines = out.splitlines()
    axis = next(line for line in lines if line.lstrip().startswith("0 B +---"))
    assert len(axis) <= 120 and "^ peak 47.76 GiB" in out and "= GPU capacity 79.15 GiB" in out
    assert lines.index("memory by phase (allocated bytes, stacked by category)") < lines.index(axis)


def test_cli_view_ascii_draws_a_measured_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    builder = TimelineBuilder()
    forward, backward = builder.code("phase", "forward"), builder.code("phase", "backward")
    rows = [(PARAMS, 4096, 0, forward), (ACT, 8192, 1, forward), (ACT, -8192, 1, backward)]
    for time, (category, nbytes, storage, phase) in enumerate(rows):
        builder.append(time, nbytes, CATEGORY_ORDER.index(category), storage, phase, -1, -1)
    path = save_timeline(builder.build(metadata={"model": "tiny"}), tmp_path / "run.npz")
    assert main(["view", str(path), "--ascii"]) == 0
    out = capsys.readouterr().out
    assert all(" " <= char <= "~" for char in out.replace("\n", ""))
    assert "memory over events (tensor bytes, stacked by category; 3 events)" in out
    assert "^ peak 12.00 KiB" in out and "event 0" in out and "event 2" in out
    assert "forward" in next(line for line in out.splitlines() if "backward" in line and "<-" not in line)


@pytest.mark.parametrize("peak", [1, 1000, 2**20 - 1, 2 * 1023 * 2**20 + 12345, 2 * GiB + 10**8, 80 * GiB, 3 * 2**40])
@pytest.mark.parametrize("height", [1, 2, 7, 11])
def test_the_y_axis_stays_aligned_whatever_the_labels(peak: int, height: int) -> None:
    series = event_series([peak // 3, peak])
    capacity = phase_series([peak // 2, peak // 4], [0, peak], capacity=peak // 3 or 1, names=("a", "b"))
    for shape in (series, capacity):
        layout = layout_timeline(shape, width=60, height=height)
        lines = plain(shape, width=60, height=height)
        axis = {line[layout.label_width + 1] for line in lines[1 : 2 + height]}
        assert axis <= {"│", "┤", "└"} and lines[1][layout.label_width + 1] == "┤"  # the top row is labelled
