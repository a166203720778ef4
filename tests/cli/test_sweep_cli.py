"""``vramlens sweep``: the table with its fit marker and growth lines, JSON, ``--sweep KEY=...``,
one-line errors naming the flag, and ``--plot`` pictures (PNG size, palette colors present)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from vramlens.categories import Category
from vramlens.cli.app import main
from vramlens.estimator.capacity import max_batch
from vramlens.report.palette import PALETTE

MODEL = "llama-3.2-1b"


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(["sweep", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_table_marks_where_it_stops_fitting(capsys: pytest.CaptureFixture[str]) -> None:
    # The marker line sits between the largest fitting batch (capacity.max_batch) and the next.
    limit = max_batch({"model": MODEL, "gpu": "a100-80gb"})
    values = ",".join(str(b) for b in range(1, limit + 3))
    status, out, err = run([MODEL, "--gpu", "a100-80gb", "--batch", values], capsys)
    assert status == 0, err
    lines = out.splitlines()
    marker = next(i for i, line in enumerate(lines) if "stops fitting" in line)
    assert lines[marker - 1].split()[0] == str(limit) and lines[marker - 1].rstrip().endswith("✓")
    assert lines[marker + 1].split()[0] == str(limit + 1) and lines[marker + 1].rstrip().endswith("✗")
    assert "activations ~ linear in batch" in out and "parameters ~ constant in batch" in out
    assert f"largest batch that fits: {limit}" in out


def test_ascii_table_and_row_errors(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run([MODEL, "--gpu", "a100-80gb", "--tp", "1,2", "--ascii"], capsys)
    assert status == 0, err
    assert "error: parallel.gpus" in out and "✓" not in out and " yes" in out


def test_json_has_axes_rows_and_growth(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(
        [MODEL, "--gpu", "a100-80gb", "--batch", "1,2", "--seq", "1k,2k", "--format", "json"], capsys
    )
    assert status == 0, err
    data: dict[str, Any] = json.loads(out)
    assert data["axes"] == [{"key": "batch", "values": [1, 2]}, {"key": "seq", "values": [1024, 2048]}]
    assert [row["values"] for row in data["rows"]] == [
        {"batch": 1, "seq": 1024},
        {"batch": 1, "seq": 2048},
        {"batch": 2, "seq": 1024},
        {"batch": 2, "seq": 2048},
    ]
    for row in data["rows"]:
        assert row["fits"] is row["report"]["fits"] and row["error"] is None
        assert row["report"]["workload"]["seq"] == row["values"]["seq"]
    assert set(data["growth"]) == {"batch", "seq"} and "activations" in data["growth"]["batch"]


def test_sweep_option_takes_any_key(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run([MODEL, "--sweep", "compile=false,true", "--format", "json"], capsys)
    assert status == 0, err
    assert json.loads(out)["axes"] == [{"key": "compile", "values": [False, True]}]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--batch", "1,x"], "error: --batch: must be an integer >= 1, got 'x'"),
        (["--seq", "2k,8q"], "error: --seq: must be an integer >= 1"),
        (["--sweep", "tpp=1,2"], "error: --sweep tpp: unknown workload key 'tpp'"),
        (["--sweep", "batch"], "error: --sweep: expected KEY=V1,V2"),
        (["--batch", "4"], "error: sweep: give one or two flags with comma-separated values"),
        (["--batch", "1,2", "--seq", "1k,2k", "--tp", "1,2"], "error: sweep: give one or two"),
    ],
)
def test_errors_are_one_line_and_name_the_flag(
    args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run([MODEL, *args], capsys)
    assert status == 2 and out == ""
    assert err.startswith(expected) and err.count("\n") == 1, err


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header (the IHDR chunk follows the 8-byte signature)."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def _pixels_of(path: Path, category: Category) -> int:
    """Pixels with exactly the category's palette color."""
    import matplotlib.image
    import numpy as np

    rgb = np.round(matplotlib.image.imread(path)[..., :3] * 255).astype(int)
    color = [int(PALETTE[category].hex[i : i + 2], 16) for i in (1, 3, 5)]
    return int(np.all(np.abs(rgb - color) <= 1, axis=-1).sum())


def test_plot_one_axis_draws_the_categories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the [plot] extra")
    target = tmp_path / "sweep.png"
    status, _, err = run([MODEL, "--gpu", "a100-80gb", "--batch", "1,2,4,8", "--plot", str(target)], capsys)
    assert status == 0, err
    assert _png_size(target) == (1100, 650)
    # llama-3.2-1b at batch 1-8: weights 4.6 GiB, optimizer state 9.2 GiB, activations 4-32 GiB per
    # bar, each many pixels tall in bars ~70 px wide; KV cache is not part of training.
    for category in (Category.PARAMETERS, Category.OPTIMIZER_STATE, Category.ACTIVATIONS):
        assert _pixels_of(target, category) > 300, category
    assert _pixels_of(target, Category.KV_CACHE) == 0


def test_plot_two_axes_and_svg(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the [plot] extra")
    target = tmp_path / "grid.svg"
    status, _, err = run(
        [MODEL, "--gpu", "a100-80gb", "--batch", "1,2,4", "--seq", "1k,2k", "--plot", str(target)], capsys
    )
    assert status == 0, err
    text = target.read_text()
    assert text.startswith("<?xml") and "batch" in text and "seq" in text and "does not fit" in text


def test_plot_refuses_a_bad_suffix_before_estimating(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run([MODEL, "--batch", "1,2", "--plot", str(tmp_path / "x.jpg")], capsys)
    assert status == 2 and err.startswith("error: --plot: cannot write")
