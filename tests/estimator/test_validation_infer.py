"""The inference estimator against published measurements (``benchmarks/accuracy.py --task infer``
on the inference points of shared/validation/public_scenarios.jsonl, bundled in benchmarks/data).

Issue 4's targets: coverage 100% of usable points, median absolute error <= 5%, 90th
percentile <= 15%, at most 5% of points under-estimated by more than 10%. vLLM's own
memory-profiling figures exclude its KV pool and are compared at level ``non_kv``
(weights + profile activation peak + non-torch memory); the others at the level they measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from accuracy import score, summary  # noqa: E402
from scenarios import VALIDATION, load_points, point_workload  # noqa: E402

from vramlens.categories import Category  # noqa: E402
from vramlens.estimator import estimate  # noqa: E402
from vramlens.model.resolve import model_from_config  # noqa: E402

#: Measured kind -> report level, for figures that include the KV cache.
MEASURED_LEVEL = {"allocated": "allocated", "active": "allocated", "reserved": "reserved"}


@pytest.fixture(scope="module")
def results() -> list:
    return score("infer")


def test_inference_accuracy_meets_the_issue_targets(results: list) -> None:
    figures = summary(results)
    assert figures["coverage"] == 1.0
    assert figures["median_ape"] <= 0.05
    assert figures["p90_ape"] <= 0.15
    assert figures["under_10pct"] <= 0.05


def test_every_usable_inference_point_is_scored(results: list) -> None:
    rows = [json.loads(line) for line in VALIDATION.read_text().splitlines() if line.strip()]
    usable = {row["id"] for row in rows if row["task"] == "infer" and row.get("usable")}
    assert usable, "no usable inference points in the bundled validation data"
    assert {r.point["id"] for r in results} == usable
    unscored = [(r.point["id"], r.reason) for r in results if r.estimate is None]
    assert not unscored
    assert all(r.point["task"] == "infer" for r in results)


def test_both_engines_are_scored(results: list) -> None:
    frameworks = {r.point["framework"] for r in results if r.estimate is not None}
    assert {"hf_generate", "vllm"} <= frameworks


def test_points_are_compared_at_the_level_they_measured() -> None:
    """vLLM profile figures (kv_cache_in_figure false) -> non_kv; allocated/active -> allocated,
    reserved -> reserved, nvidia-smi/unknown -> device."""
    points = load_points(task="infer")
    assert any(point.get("kv_cache_in_figure") is False for point in points)
    for point in points:
        level = point_workload(point).level
        if point.get("kv_cache_in_figure", True) is False:
            assert level == "non_kv", point["id"]
        else:
            assert level == MEASURED_LEVEL.get(point["measured_kind"], "device"), point["id"]


def test_inference_points_map_to_inference_workloads() -> None:
    for point in load_points(task="infer"):
        workload = point_workload(point).workload
        assert workload is not None, point["id"]
        assert workload["mode"] == "infer"
        assert workload["engine"] == {"hf_generate": "hf", "vllm": "vllm"}[point["framework"]]
        assert workload["batch"] == point["micro_batch"]
        assert (workload["prompt"], workload["generate"]) == (point["prompt_len"], point["gen_len"])


def test_non_kv_figures_leave_out_the_kv_pool_and_cuda_graphs(results: list) -> None:
    """The non_kv figure is the profile phase (weights + activation peak, no KV) plus non-torch memory."""
    profiled = [r for r in results if r.level == "non_kv"]
    assert profiled
    for result in profiled:
        workload = dict(point_workload(result.point).workload or {})
        workload["model"] = model_from_config(result.point["hf_config"], name=result.point["model_name"])
        report = estimate(workload)
        profile = next(phase for phase in report.phases if phase.name == "profile")
        assert Category.KV_CACHE not in profile.breakdown, result.point["id"]
        assert "cuda_graphs" in report.runtime
        non_torch = report.device_bytes - report.allocated_bytes - report.runtime["cuda_graphs"]
        assert result.estimate == profile.allocated_bytes + non_torch, result.point["id"]
        assert result.estimate < report.device_bytes
