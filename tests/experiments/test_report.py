"""The experiment table (terminal and Markdown) and plot, on rows worked out by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vramlens.experiments.render.table import experiment_markdown, experiment_rows, experiment_text
from vramlens.units import GiB, MiB

ROWS: list[dict[str, Any]] = [
    {"name": "control", "techniques": [], "measured_peak_bytes": 100 * MiB, "step_seconds": 1.0,
     "tokens_per_s": 1024.0, "loss": 7.5, "predicted_peak_bytes": 101 * MiB, "simulated_peak_bytes": 100 * MiB},
    {"name": "bf16", "techniques": ["bf16"], "measured_peak_bytes": 60 * MiB, "step_seconds": 0.5,
     "tokens_per_s": 2048.0, "loss": 7.25, "predicted_peak_bytes": 63 * MiB, "simulated_peak_bytes": None},
    {"name": "8bit-optimizer", "techniques": ["8bit-optimizer"], "measured_peak_bytes": None,
     "predicted_peak_bytes": 80 * MiB, "skipped": "8bit-optimizer: bitsandbytes is not available on this machine"},
]  # fmt: skip


def test_figures_against_the_control() -> None:
    control, bf16, skipped = experiment_rows(ROWS)
    assert control.reduction is None and control.relative_time == 1.0
    assert bf16.reduction == pytest.approx(0.4)  # 1 - 60/100
    assert bf16.relative_time == pytest.approx(0.5)
    assert bf16.predicted_error == pytest.approx(0.05)  # (63 - 60) / 60
    assert control.simulated_error == 0.0 and bf16.simulated_error is None
    assert skipped.reduction is None and skipped.predicted_error is None and skipped.skipped


def test_terminal_table() -> None:
    text = experiment_text(ROWS, device="cpu")
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["Configuration", "Peak", "(MiB)"]
    assert lines[3].split() == ["bf16", "60.000", "40.0%", "2,048", "0.50x", "7.2500", "63.000", "+5.0%", "-", "-"]
    assert "device: cpu; peaks are allocated-level, MiB = 2**20 bytes" in text
    assert "8bit-optimizer: skipped (8bit-optimizer: bitsandbytes is not available on this machine)" in text


def test_markdown_table_switches_to_gib_for_large_peaks() -> None:
    big = [row | {"measured_peak_bytes": (row["measured_peak_bytes"] or 0) * 1024 or None} for row in ROWS[:2]]
    text = experiment_markdown(big, device="cuda")
    assert text.splitlines()[0].startswith("| Configuration | Peak (GiB) | Reduction |")
    assert "| bf16 | 60.000 | 40.0% | 2,048 | 0.50x | 7.2500 |" in text
    assert big[0]["measured_peak_bytes"] == 100 * GiB


def test_plot_draws_every_measured_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from vramlens.experiments.render.plot import save_experiment_plot

    target = save_experiment_plot(ROWS, tmp_path / "e.svg", device="cpu")
    svg = target.read_text()
    assert 'id="measured-control"' in svg and 'id="measured-bf16"' in svg
    assert "measured-8bit-optimizer" not in svg
    assert "peak allocated memory (MiB)" in svg
