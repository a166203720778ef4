"""The RLHF picture (report/rlhf_plot.py): PNG and SVG files with one path per category and per
model, the capacity line and the peak's label; bad paths refused in one line."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the [plot] extra")

from _rlhf_hand_reports import report

from vramlens.errors import InputError
from vramlens.rlhf.render.plot import plot_rlhf

SVG = "{http://www.w3.org/2000/svg}"


def test_png_is_a_png(tmp_path: Path) -> None:
    target = plot_rlhf(report(), tmp_path / "step.png")
    data = target.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # width and height in the IHDR chunk: the default 1400 x 650 px.
    assert int.from_bytes(data[16:20], "big") == 1400 and int.from_bytes(data[20:24], "big") == 650


def test_svg_has_a_path_per_category_and_per_model_and_the_labels(tmp_path: Path) -> None:
    target = plot_rlhf(report(), tmp_path / "step.svg")
    root = ET.parse(target).getroot()
    ids = {element.get("id") for element in root.iter(f"{SVG}g")}
    for category in ("parameters", "kv_cache", "activations", "optimizer_state", "allocator_slack", "runtime"):
        assert f"area-{category}" in ids
    for role in ("actor", "critic", "reward", "reference", "shared", "overhead"):
        assert f"model-{role}" in ids
    text = " ".join("".join(element.itertext()) for element in root.iter(f"{SVG}text"))
    assert "peak 82.0 GiB" in text and "2.0 GiB over" in text  # the hand report: 82 GiB on an 80 GiB GPU
    assert "GPU: 80.0 GiB" in text
    assert "PPO step, actor llama-3.2-1b on 1 x h100-80gb" in text
    assert "does NOT fit 80.0 GiB (2.0 GiB over)" in text
    assert "(runs reward)" in text  # the by-model ticks name what each phase runs


def test_same_report_same_svg(tmp_path: Path) -> None:
    first = plot_rlhf(report(), tmp_path / "a.svg").read_bytes()
    assert plot_rlhf(report(), tmp_path / "b.svg").read_bytes() == first


@pytest.mark.parametrize(
    ("name", "message"),
    [("step.jpg", "--plot: cannot write .*accepted suffixes: .png, .svg"), ("no/such/step.png", "does not exist")],
)
def test_bad_paths_are_refused_in_one_line(tmp_path: Path, name: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        plot_rlhf(report(), tmp_path / name)
