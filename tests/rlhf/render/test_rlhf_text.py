"""The RLHF terminal picture (report/rlhf_text.py) and the series it shares with the plot and the
HTML page (report/rlhf_series.py), on hand-made reports whose bars can be counted by hand."""

from __future__ import annotations

import dataclasses
import io

import pytest
from _rlhf_hand_reports import phase, report
from rich.console import Console

from vramlens.categories import Category
from vramlens.rlhf.render.series import model_segments, peak_index, rlhf_series
from vramlens.rlhf.render.text import RlhfTimeline, render_rlhf_timeline
from vramlens.rlhf.report import ModelState
from vramlens.units import GiB


def by_model_lines(text: str) -> dict[str, str]:
    """The by-model bars of a rendered picture, by phase name."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("by model"))
    names = ("generation", "scoring", "actor training")
    return {name: line for line in lines[start + 1 :] for name in names if line.startswith(name + " ")}


def test_series_is_the_device_level_stacked_by_category() -> None:
    # generation: 40 GiB weights (parameters) + 20 KV + 1 slack + 1 runtime = 62 GiB device.
    series = rlhf_series(report())
    assert series.level == "device" and series.x_unit == "phase"
    assert series.total.tolist() == [62 * GiB, 46 * GiB, 82 * GiB]
    assert Category.ALLOCATOR_SLACK in series.categories and Category.RUNTIME in series.categories
    kv = series.values[series.categories.index(Category.KV_CACHE)].tolist()
    assert kv == [20 * GiB, 0, 0]
    assert series.peak_index == 2 and series.peak_bytes == 82 * GiB
    assert [name for name, _, _ in series.phases] == ["generation", "scoring", "actor_training"]


def test_model_segments_add_up_to_the_device_level_and_skip_other_groups() -> None:
    generation = report().phases[0]
    segments = dict(model_segments(generation))
    # 10 GiB per model; the 20 GiB KV cache belongs to no model state here: shared.
    assert segments == {
        "actor": 10 * GiB, "critic": 10 * GiB, "reward": 10 * GiB, "reference": 10 * GiB,
        "shared": 20 * GiB, "overhead": 2 * GiB,
    }  # fmt: skip
    assert sum(segments.values()) == generation.device_bytes
    # A reward model on its own GPU group is not on the shared group's busiest GPU.
    models = dict(generation.models)
    models["reward"] = ModelState(role="reward", where="gpu", bytes=10 * GiB, breakdown={}, busy=False, group="reward")
    split = dataclasses.replace(generation, models=models, gpu_group="shared")
    assert "reward" not in dict(model_segments(split))


def test_offloaded_models_are_not_drawn() -> None:
    offloaded = phase("scoring", {"reward": 10}, "reward", {})
    assert dict(model_segments(offloaded)) == {"reward": 10 * GiB, "overhead": 2 * GiB}


@pytest.mark.parametrize("width", [40, 64, 80, 120])
@pytest.mark.parametrize("ascii", [True, False])
def test_lines_fit_the_width_and_ascii_is_ascii(width: int, ascii: bool) -> None:
    text = render_rlhf_timeline(report(), width=width, ascii=ascii)
    assert max(len(line) for line in text.splitlines()) <= width
    if ascii:
        assert text.isascii()
    elif width >= 64:  # narrower, the peak's label under the timeline gives way to the phase names
        assert "▲" in text and "┃" in text and "◀ peak" in text


def test_bars_are_as_long_as_the_numbers_say() -> None:
    # Scale: max(peak 82 GiB, capacity 80 GiB) = 82 GiB over the bar's cells; the capacity mark
    # sits on the cell that holds 80 GiB: round(80 / 82 * cells) - 1.
    text = render_rlhf_timeline(report(), width=80, ascii=True)
    bars = by_model_lines(text)
    name_width = len("actor training") + 1
    cells = 80 - name_width - 19
    mark = round(80 / 82 * cells) - 1
    for name, device in (("generation", 62), ("scoring", 46), ("actor training", 82)):
        bar = bars[name][name_width : name_width + cells]
        assert bar[mark] == "|"
        filled = sum(1 for i, char in enumerate(bar) if char != " " and i != mark) + (device >= 80)
        assert filled == round(device / 82 * cells)
        assert f"{device:.1f} GiB" in bars[name]
    assert bars["actor training"].endswith("< peak") and not bars["scoring"].endswith("< peak")
    # actor's 10 GiB of 82: about 6 cells of "a" in every phase.
    assert bars["generation"][name_width:].startswith("a" * round(10 / 82 * cells))


def test_verdict_over_and_under_the_capacity() -> None:
    over = render_rlhf_timeline(report(), width=100, ascii=True)
    assert "peak: actor training, 82.0 GiB on the device: does NOT fit 80.0 GiB (2.0 GiB over)" in over
    fits = render_rlhf_timeline(report(capacity_gib=100), width=100, ascii=True)
    assert "fits 100.0 GiB (headroom 18.0 GiB)" in fits
    narrow = render_rlhf_timeline(report(), width=50, ascii=True).splitlines()
    assert narrow[-2].startswith("peak: actor training") and narrow[-1].startswith("  ")
    assert " ".join(line.strip() for line in narrow[-2:]).endswith("does NOT fit 80.0 GiB (2.0 GiB over)")


def test_peak_follows_the_report_and_the_category_legend_is_there() -> None:
    calm = report(training_extra=2)  # actor training at 44 GiB: generation (62 GiB) is the peak
    assert calm.peak_phase == "generation" and peak_index(calm) == 0
    text = render_rlhf_timeline(calm, width=100, ascii=True)
    assert by_model_lines(text)["generation"].endswith("< peak")
    for label in ("K KV cache", "O optimizer state", ". allocator slack", "R runtime", "= GPU capacity"):
        assert label in text


def test_renderable_turns_ascii_on_a_console_that_cannot_show_blocks() -> None:
    buffer = io.BytesIO()
    stream = io.TextIOWrapper(buffer, encoding="ascii", errors="strict")  # a LANG=C terminal
    console = Console(file=stream, width=90, color_system=None, legacy_windows=False)
    console.print(RlhfTimeline(report=report()))  # would raise on a block character
    stream.flush()
    assert "< peak" in buffer.getvalue().decode("ascii")
    wide = io.StringIO()
    Console(file=wide, width=90, color_system=None).print(RlhfTimeline(report=report(), width=70))
    assert "◀ peak" in wide.getvalue() and max(len(line) for line in wide.getvalue().splitlines()) <= 70
