"""vLLM's two questions kept apart: "the engine starts" (weights, activation peak and non-torch
memory leave a pool for at least one sequence) and "the batch fits the pool"; the headroom is the
GPU's (capacity - GPU total), never the pool's slack (it was, next to a GPU-level peak)."""

from __future__ import annotations

import json
from typing import Any

from vramlens.cli import main
from vramlens.estimator import estimate
from vramlens.report.text import fit_line, markdown_report
from vramlens.units import format_bytes

VLLM = {"model": "llama-3.1-8b", "mode": "infer", "engine": "vllm", "gpu": "h100"}


def test_starts_and_fits_with_the_gpu_total() -> None:
    report = estimate(VLLM)
    serving = report.serving
    assert serving is not None and serving.engine_starts and serving.fits
    assert report.headroom_bytes == (report.capacity_bytes or 0) - report.device_bytes
    assert fit_line(report).plain == (
        f"vLLM starts on h100-sxm-80gb (79.19 GiB) and the batch fits its KV pool; "
        f"GPU total {format_bytes(report.device_bytes)}"
    )
    assert serving.engine_bytes == (serving.budget_bytes or 0) - (serving.kv_pool_bytes or 0)


def test_starts_but_the_batch_does_not_fit(capsys: Any) -> None:
    report = estimate({**VLLM, "batch": 64, "context": 32768})
    serving = report.serving
    assert serving is not None and serving.engine_starts is True and serving.fits is False and report.fits is False
    assert fit_line(report).plain.startswith("vLLM starts on h100-sxm-80gb (79.19 GiB), but the batch does NOT fit")
    assert "vLLM starts on h100-sxm-80gb (79.19 GiB), but the batch does **not** fit" in markdown_report(report)
    capsys.readouterr()
    assert main(["estimate", "llama-3.1-8b", "--mode", "infer", "--engine", "vllm", "--gpu", "h100", "--batch", "64",
                 "--context", "32768", "--format", "json"]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert data["serving"]["engine_starts"] is True and data["serving"]["batch_fits_pool"] is False
    assert data["headroom_bytes"] == data["gpu"]["capacity_bytes"] - data["peak"]["device_bytes"] >= 0


def test_does_not_start_when_one_sequence_does_not_fit() -> None:
    report = estimate({**VLLM, "model": "llama-3.1-70b", "parallel": {"tp": 2, "gpus": 2}, "context": 32768})
    serving = report.serving
    assert serving is not None and 0 < (serving.kv_pool_bytes or 0) < serving.kv_bytes_needed // serving.sequences
    assert serving.engine_starts is False and report.fits is False
    assert (
        fit_line(report).plain
        == "vLLM does NOT start on h100-sxm-80gb (79.19 GiB): no room for one sequence of 32768 tokens"
    )
