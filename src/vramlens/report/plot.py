"""Static pictures of a :class:`~vramlens.result.report.MemoryReport`: PNG or SVG (the ``[plot]`` extra).

:func:`save_plot` draws what :func:`~vramlens.report.series.report_series` gives, in the colors
of :mod:`vramlens.report.palette`:

* left, live bytes stacked by category: a step-like stacked area over the timeline (simulated,
  measured, snapshot), with the phases as alternating light bands named along the top, or, for
  an estimate, stacked bars over its phases; the GPU's usable memory as a dashed line; the peak
  marked with an arrow ("peak 61.2 GiB in backward");
* right, the breakdown at the peak as horizontal bars (the report's categories, plus allocator
  slack and runtime memory when the report has them, so the bars add up to the device level).

:func:`save_comparison` (in :mod:`vramlens.report.plot_compare`) draws several reports' peak
breakdowns side by side. Bytes are shown in binary units (GiB = 2**30, MiB = 2**20; never GB).

matplotlib is imported lazily through :func:`vramlens._extras.require` and only through its
object API (``Figure`` on the Agg canvas; pyplot is never used), so nothing leaks between calls.
In an SVG each category's band is one ``<path>`` inside a group with the id ``area-<category>``
(``bar-<category>`` for the breakdown bars) and text stays text (``svg.fonttype = "none"``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from vramlens._extras import require
from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.report.palette import PALETTE
from vramlens.report.series import StackedSeries, report_series
from vramlens.report.serving_text import vllm_fit_sentence
from vramlens.result.report import MemoryReport
from vramlens.units import GiB, KiB, MiB, TiB, format_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["SUFFIXES", "save_comparison", "save_plot", "visible_categories"]

#: File types :func:`save_plot` writes.
SUFFIXES = (".png", ".svg")
_HEADROOM = 1.25  # the y axis's top over max(peak, capacity): room for the phase names and the peak's label


@dataclass(frozen=True, kw_only=True, slots=True)
class Scale:
    """A binary unit for an axis: its name and its size in bytes."""

    name: str
    bytes: int


def save_plot(
    report: MemoryReport, path: str | os.PathLike[str], *, width_px: int = 1400, height_px: int = 700, dpi: int = 100
) -> Path:
    """Draw ``report`` (stacked memory by category over time or phases, capacity, peak, and the
    breakdown at the peak) into ``path`` (.png or .svg) of ``width_px`` x ``height_px`` pixels."""
    from vramlens.report.plot_compare import draw_breakdown, draw_phase_bars

    target = plot_target(path)
    check_size(width_px, height_px, dpi)
    series = report_series(report, max_points=max(2, 2 * width_px))
    scale = scale_for(max(series.peak_bytes, series.capacity_bytes or 0))
    with figure_of(width_px, height_px, dpi) as figure:
        main, side = figure.subplots(1, 2, width_ratios=(3.0, 1.15))
        if series.x_unit == "phase":
            draw_phase_bars(main, series, scale)
        else:
            _draw_area(main, series, scale)
        main.set_ylim(0, max(series.peak_bytes, series.capacity_bytes or 0, 1) * _HEADROOM / scale.bytes)
        main.set_ylabel(f"memory ({scale.name})")
        draw_capacity(main, series.capacity_bytes, report.gpu, scale)
        _draw_peak(main, series, report, scale)
        draw_breakdown(side, report)
        figure.suptitle(_title(report, series), x=0.01, ha="left", fontsize=12)
        add_legend(figure, visible_categories(series))
        if series.x_unit != "phase":
            _draw_phase_bands(main, series)
        save_figure(figure, target, dpi)
    return target


def save_comparison(
    reports: Sequence[MemoryReport],
    path: str | os.PathLike[str],
    *,
    labels: Sequence[str] | None = None,
    width_px: int = 1000,
    height_px: int = 650,
    dpi: int = 100,
) -> Path:
    """Several reports' peak breakdowns side by side: :func:`vramlens.report.plot_compare.save_comparison`."""
    from vramlens.report.plot_compare import save_comparison as draw

    return draw(reports, path, labels=labels, width_px=width_px, height_px=height_px, dpi=dpi)


def visible_categories(series: StackedSeries) -> tuple[Category, ...]:
    """Categories of ``series`` with bytes at some point: those drawn, one band each."""
    return tuple(c for c, row in zip(series.categories, series.values, strict=True) if np.any(row > 0))


def plot_target(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path, refusing a suffix other than .png/.svg or a missing folder (one line)."""
    target = Path(path)
    if target.suffix.lower() not in SUFFIXES:
        raise InputError(f"--plot: cannot write {str(target)!r}; accepted suffixes: {', '.join(SUFFIXES)}")
    if not target.parent.is_dir():
        raise InputError(f"--plot: folder {str(target.parent)!r} does not exist")
    return target


def check_size(width_px: int, height_px: int, dpi: int) -> None:
    """Refuse picture sizes outside what a screen or a page can use (one line)."""
    if not (200 <= width_px <= 10_000 and 150 <= height_px <= 10_000 and 20 <= dpi <= 600):
        raise InputError(
            f"plot size: {width_px}x{height_px} px at {dpi} dpi; accepted: 200-10000 x 150-10000 px, 20-600 dpi"
        )


def scale_for(top_bytes: int) -> Scale:
    """The largest binary unit (TiB, GiB, MiB, KiB, B) in which ``top_bytes`` is at least 1."""
    for name, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if top_bytes >= size:
            return Scale(name=name, bytes=size)
    return Scale(name="B", bytes=1)


@contextmanager
def figure_of(width_px: int, height_px: int, dpi: int) -> Iterator[Figure]:
    """A new Figure of that many pixels on the Agg canvas, with text kept as text in SVG.

    The rc settings apply while the figure is drawn and saved and are restored afterwards; with
    ``text.parse_math`` off, a ``$`` in a model or phase name is a dollar sign, not mathtext."""
    mpl = require("matplotlib", purpose="--plot (PNG/SVG pictures)")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    settings = {
        "svg.fonttype": "none", "svg.hashsalt": "vramlens", "font.size": 9.0, "axes.titlesize": 10.0,
        "text.parse_math": False, "text.usetex": False,  # names from files are drawn as they are, never as TeX
    }  # fmt: skip
    with mpl.rc_context(settings):
        figure = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi, layout="constrained")
        FigureCanvasAgg(figure)
        yield figure


def save_figure(figure: Figure, target: Path, dpi: int) -> None:
    """Write the figure as PNG or SVG (by suffix), without a date so equal reports give equal files."""
    fmt = target.suffix.lower().lstrip(".")
    metadata: dict[str, Any] = {"Date": None} if fmt == "svg" else {"Software": "vramlens"}
    try:
        figure.savefig(target, format=fmt, dpi=dpi, metadata=metadata)
    except OSError as error:
        raise InputError(f"--plot: cannot write {str(target)!r}: {error.strerror or error}") from None


def band_path(xs: npt.NDArray[np.float64], bottom: npt.NDArray[np.float64], top: npt.NDArray[np.float64]) -> Any:
    """The band between ``bottom`` and ``top`` over ``xs`` as one compound path (a matplotlib
    Path, one SVG ``<path>``): a closed polygon per stretch where the band is thicker than 0, so
    its outline never runs along stretches where the category has no bytes."""
    from matplotlib.path import Path as MplPath

    thick = np.flatnonzero(top > bottom)
    if not len(thick):
        return MplPath(np.zeros((1, 2)))
    breaks = np.flatnonzero(np.diff(thick) > 1)
    starts, ends = thick[np.r_[0, breaks + 1]], thick[np.r_[breaks, len(thick) - 1]]
    pieces, codes = [], []
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        run = slice(start, end + 1)
        upper = np.column_stack([xs[run], top[run]])
        lower = np.column_stack([xs[run][::-1], bottom[run][::-1]])
        pieces.append(np.vstack([upper, lower, upper[:1]]))
        code = np.full(len(pieces[-1]), MplPath.LINETO, dtype=np.uint8)
        code[0], code[-1] = MplPath.MOVETO, MplPath.CLOSEPOLY
        codes.append(code)
    return MplPath(np.vstack(pieces), np.concatenate(codes))


def rectangles_path(rects: Sequence[tuple[float, float, float, float]]) -> Any:
    """One compound path of rectangles ``(x0, x1, y0, y1)`` (one SVG ``<path>`` for all of them)."""
    from matplotlib.path import Path as MplPath

    vertices: list[tuple[float, float]] = []
    codes: list[int] = []
    move, line, close = int(MplPath.MOVETO), int(MplPath.LINETO), int(MplPath.CLOSEPOLY)
    for x0, x1, y0, y1 in rects:
        vertices += [(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)]
        codes += [move, line, line, line, close]
    return MplPath(vertices or [(0.0, 0.0)], codes or None)


def add_patch(ax: Axes, path: Any, category: Category, gid: str, *, edge: str = "white") -> None:
    """Add ``path`` filled in the category's color, with the SVG id ``gid``. ``edge``: ``white``
    (a thin line that separates bars), ``own`` (a hairline in the fill's color, which keeps
    spikes narrower than a pixel visible) or ``none``."""
    from matplotlib.patches import PathPatch

    color = PALETTE[category].hex
    stroke = {"white": ("white", 0.6), "own": (color, 0.9)}.get(edge, ("none", 0.0))
    patch = PathPatch(path, facecolor=color, edgecolor=stroke[0], linewidth=stroke[1], zorder=2)
    patch.set_gid(gid)
    ax.add_patch(patch)


def stack_of(series: StackedSeries) -> tuple[npt.NDArray[np.float64], list[Category]]:
    """Cumulative tops of the visible categories, bottom first: shape (categories + 1, points)."""
    visible = visible_categories(series)
    rows = [row for c, row in zip(series.categories, series.values, strict=True) if c in visible]
    values = np.array(rows, dtype=np.float64).reshape(len(rows), len(series.x))
    return np.vstack([np.zeros((1, len(series.x))), np.cumsum(values, axis=0)]), list(visible)


def _draw_area(ax: Axes, series: StackedSeries, scale: Scale) -> None:
    """The stacked area, as steps: each point's bytes hold until the next point."""
    factor, label = _time_axis(series)
    x = _extended(series) * factor
    cumulative, visible = stack_of(series)
    xs = np.repeat(x, 2)[1:-1]
    hairline = series.peak_bytes / 500  # about a pixel: thinner bands get no outline, so stay unseen
    for index, category in enumerate(visible):
        bottom = np.repeat(cumulative[index], 2) / scale.bytes
        top = np.repeat(cumulative[index + 1], 2) / scale.bytes
        thick = float(np.max(cumulative[index + 1] - cumulative[index])) >= hairline
        add_patch(ax, band_path(xs, bottom, top), category, f"area-{category.value}", edge="own" if thick else "none")
    ax.set_xlim(float(x[0]), float(x[-1]))
    ax.set_xlabel(label)
    if series.x_unit == "event":
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _extended(series: StackedSeries) -> npt.NDArray[np.float64]:
    """The points' x and one more, 1% of the span (1 for a single point) after the last, so the
    last state is drawn as a step of its own."""
    span = float(series.x[-1] - series.x[0])
    return np.append(series.x, series.x[-1] + (span * 0.01 if span > 0 else 1.0))


def _time_axis(series: StackedSeries) -> tuple[float, str]:
    """What to multiply x by, and the axis label: seconds past 10 s, else ms, or event numbers."""
    if series.x_unit != "ms":
        return 1.0, "event"
    return (1e-3, "time (s)") if len(series.x) and series.x[-1] > 10_000 else (1.0, "time (ms)")


def draw_capacity(ax: Axes, capacity_bytes: int | None, gpu: str | None, scale: Scale) -> None:
    """The GPU's usable memory as a dashed line, labelled at its right end."""
    if capacity_bytes is None:
        return
    y = capacity_bytes / scale.bytes
    ax.axhline(y, color="#b22222", linestyle=(0, (5, 3)), linewidth=1.2, zorder=3)
    text = f"{gpu or 'GPU'}: {format_bytes(capacity_bytes, precision=1)}"
    ax.annotate(
        text, (1.0, y), xycoords=("axes fraction", "data"), xytext=(-4, 3), textcoords="offset points",
        ha="right", va="bottom", color="#b22222", fontsize=9, zorder=6,
        bbox={"boxstyle": "square,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
    )  # fmt: skip


def _peak_phase(series: StackedSeries, report: MemoryReport) -> str:
    """The phase the series' peak falls in (the report's peak phase when unnamed)."""
    if series.x_unit == "phase" and series.peak_index >= 0:
        return series.phases[series.peak_index][0]
    inside = [name for name, first, last in series.phases if first <= series.peak_x <= last]
    return inside[0] if inside else report.peak_phase


def peak_label(series: StackedSeries, report: MemoryReport) -> str:
    """``peak 61.2 GiB in backward``: the text next to the peak's arrow."""
    return f"peak {format_bytes(series.peak_bytes, precision=1)} in {_peak_phase(series, report).replace('_', ' ')}"


def _draw_peak(ax: Axes, series: StackedSeries, report: MemoryReport, scale: Scale) -> None:
    """An arrow from above to the top of the peak, with :func:`peak_label`."""
    if series.peak_index < 0:
        return
    x = series.peak_x * (_time_axis(series)[0] if series.x_unit != "phase" else 1.0)
    left, right = ax.get_xlim()
    share = (x - left) / (right - left) if right > left else 0.5
    to_left = share > 0.55
    top = ax.get_ylim()[1] * scale.bytes
    height = min(series.peak_bytes / top + 0.15, 0.88)
    if series.capacity_bytes is not None and abs(series.capacity_bytes / top - height) < 0.05:
        height = min(series.capacity_bytes / top + 0.07, 0.9)  # clear of the capacity line
    ax.annotate(
        peak_label(series, report), (x, series.peak_bytes / scale.bytes),
        xytext=(share - 0.04 if to_left else share + 0.04, height), textcoords="axes fraction",
        ha="right" if to_left else "left", va="center", fontsize=10, fontweight="bold", zorder=5,
        arrowprops={"arrowstyle": "->", "color": "#222222", "linewidth": 1.2, "shrinkB": 1},
    )  # fmt: skip


def _draw_phase_bands(ax: Axes, series: StackedSeries) -> None:
    """Alternating light bands, one per phase stretch, named along the top where the name fits.

    Called last, after the layout is known, so names that would overlap are left out."""
    from matplotlib.transforms import blended_transform_factory

    factor = _time_axis(series)[0]
    spans = series.phases
    where = blended_transform_factory(ax.transData, ax.transAxes)
    texts = []
    for index, (name, first, _last) in enumerate(spans):
        end = spans[index + 1][1] if index + 1 < len(spans) else float(_extended(series)[-1])
        lo, hi = first * factor, end * factor
        ax.axvspan(lo, hi, color="#1f2937" if index % 2 == 0 else "#6b7280", alpha=0.07, linewidth=0, zorder=0)
        text = ax.text((lo + hi) / 2, 0.975, name.replace("_", " "), transform=where, ha="center", va="top")
        text.set(fontsize=8, color="#374151", clip_on=True, zorder=4)
        texts.append((text, lo, hi))
    _place_names(ax, texts)


def _place_names(ax: Axes, texts: list[tuple[Any, float, float]]) -> None:
    """Keep each name inside the axes (a name past an edge is aligned to it), and hide names
    much wider than their band or too close to the previous name shown."""
    if not texts:
        return
    figure = ax.get_figure()
    figure.draw_without_rendering()  # type: ignore[union-attr]
    renderer = figure.canvas.get_renderer()  # type: ignore[union-attr]
    frame = ax.get_window_extent(renderer)
    left, right = ax.get_xlim()
    shown_right = -np.inf
    for text, lo, hi in texts:
        box = text.get_window_extent(renderer)
        if box.x1 > frame.x1 - 2 or box.x0 < frame.x0 + 2:
            outside_right = box.x1 > frame.x1 - 2
            inset = (right - left) * 0.004
            text.set(x=right - inset if outside_right else left + inset, ha="right" if outside_right else "left")
            box = text.get_window_extent(renderer)
        band = ax.transData.transform([(lo, 0), (hi, 0)])[:, 0]
        fits = box.width <= (band[1] - band[0]) * 1.6 and box.x0 > shown_right + 12
        text.set_visible(bool(fits))
        if fits:
            shown_right = box.x1


def add_legend(figure: Figure, categories: Sequence[Category]) -> None:
    """The categories drawn, in stacking order, in one row under the plots."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=PALETTE[c].hex, label=PALETTE[c].label) for c in categories]
    if handles:
        figure.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 8), frameon=False)


def _title(report: MemoryReport, series: StackedSeries) -> str:
    """Model, engine and level on one line; the workload and the fit on a second one."""
    head = f"{report.model} - {report.engine} ({series.level} level)"
    facts = workload_facts(report)
    vllm = vllm_fit_sentence(report)
    if vllm is not None:
        facts.append(vllm[0])
    elif report.capacity_bytes is not None and report.fits is not None:
        headroom = report.headroom_bytes or 0
        facts.append(
            f"fits {report.gpu}: headroom {format_bytes(headroom, precision=1)}"
            if report.fits
            else f"does NOT fit {report.gpu}: short by {format_bytes(-headroom, precision=1)}"
        )
    return head + ("\n" + " | ".join(facts) if facts else "")


def workload_facts(report: MemoryReport) -> list[str]:
    """A few facts of the workload for a subtitle: training (mode, method, batch x sequence,
    precision) or inference (mode, engine, batch x prompt + generate or context, precision, the
    weights' quantization and the KV dtype when set)."""
    workload = report.workload_dict
    if workload.get("mode") == "infer":
        tokens = (
            f"context {workload['context']}"
            if workload.get("context") is not None
            else f"prompt {workload.get('prompt')} + generate {workload.get('generate')}"
        )
        engine = "vllm" if workload.get("framework") == "vllm" else workload.get("engine")
        facts = ["infer", str(engine), f"batch {workload.get('batch')} x {tokens}", str(workload.get("precision"))]
        if workload.get("quant") not in (None, "none"):
            facts.append(f"weights {workload['quant']}")
        if workload.get("kv_dtype") not in (None, "auto"):
            facts.append(f"KV {workload['kv_dtype']}")
        return facts
    facts = [str(workload[key]) for key in ("mode", "method", "precision") if workload.get(key)]
    if workload.get("batch") and workload.get("seq"):
        facts.insert(2 if len(facts) >= 2 else len(facts), f"batch {workload['batch']} x seq {workload['seq']}")
    return facts
