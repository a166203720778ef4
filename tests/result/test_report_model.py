"""``MemoryReport``: the JSON report contract (shared/docs/WORKLOAD.md), fit and headroom, peak bookkeeping."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vramlens.categories import LEVEL_CATEGORIES, Category
from vramlens.estimator import estimate
from vramlens.hardware import resolve_gpu
from vramlens.result.report import MemoryReport, PhaseMemory, Term
from vramlens.units import GiB, MiB

MODEL = "llama-3.1-8b"

WORKLOADS: dict[str, dict[str, Any]] = {
    "full": {"model": MODEL},
    "lora": {"model": MODEL, "method": "lora"},
    "qlora": {"model": MODEL, "method": "qlora"},
    "fsdp": {"model": MODEL, "parallel": {"gpus": 8, "shard": "fsdp"}},
    "pipeline": {"model": MODEL, "parallel": {"gpus": 4, "pp": 4}},
    "moe-ep": {"model": "mixtral-8x7b", "parallel": {"gpus": 8, "ep": 8, "shard": "fsdp"}, "seq": 1024},
}
GPUS = ["h100-80gb", "a100-sxm-40gb", "8GiB", "1TiB"]
CONTRACT_KEYS = {"peak", "breakdown", "phases", "fits", "headroom_bytes", "assumptions", "engine", "workload"}


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def hand_report(capacity: int | None = None, **changes: Any) -> MemoryReport:
    """A small report built by hand, independent of the estimator."""
    forward = PhaseMemory(
        name="forward",
        allocated_bytes=6 * GiB,
        breakdown={Category.PARAMETERS: 2 * GiB, Category.ACTIVATIONS: 4 * GiB, Category.GRADIENTS: 0},
        note="end of forward",
    )
    step = PhaseMemory(
        name="optimizer_step",
        allocated_bytes=4 * GiB,
        breakdown={Category.PARAMETERS: 2 * GiB, Category.GRADIENTS: 2 * GiB},
    )
    fields: dict[str, Any] = {
        "engine": "estimate",
        "model": "toy",
        "workload": {"model": "toy", "batch": 1},
        "phases": (forward, step),
        "peak_phase": "forward",
        "allocated_bytes": 6 * GiB,
        "reserved_bytes": 7 * GiB,
        "device_bytes": 7 * GiB + 512 * MiB,
        "gpu": None if capacity is None else "toy-gpu",
        "capacity_bytes": capacity,
        "runtime": {"cuda_context": 512 * MiB},
    }
    return MemoryReport(**{**fields, **changes})


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_to_dict_is_plain_json_with_every_contract_key(name: str) -> None:
    report = estimate(WORKLOADS[name])
    data = report.to_dict()
    assert json.loads(json.dumps(data)) == data  # no default=, and no tuples or enums that change on the way
    assert set(data) >= CONTRACT_KEYS
    assert data["engine"] == "estimate"
    assert set(data["peak"]) >= {"allocated_bytes", "reserved_bytes", "device_bytes", "phase"}
    assert all(is_int(data["peak"][k]) for k in ("allocated_bytes", "reserved_bytes", "device_bytes"))
    assert data["fits"] is None and data["headroom_bytes"] is None  # no GPU given
    assert isinstance(data["assumptions"], list) and all(isinstance(a, str) for a in data["assumptions"])
    assert data["assumptions"], "auto settings were resolved, so the assumptions say what was chosen"
    workload = data["workload"]
    assert isinstance(workload, dict) and workload["model"] == WORKLOADS[name]["model"]
    assert workload["framework"] == "auto" and isinstance(workload["parallel"], dict)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_breakdown_is_the_allocated_level_at_the_peak(name: str) -> None:
    data = estimate(WORKLOADS[name]).to_dict()
    peak = data["peak"]
    names = [phase["name"] for phase in data["phases"]]
    assert peak["phase"] in names and len(set(names)) == len(names)
    allocated_level = {c.value for c in LEVEL_CATEGORIES["allocated"]}
    assert set(data["breakdown"]) <= allocated_level
    assert all(is_int(v) and v > 0 for v in data["breakdown"].values())
    assert sum(data["breakdown"].values()) == peak["allocated_bytes"]
    assert peak["allocated_bytes"] <= peak["reserved_bytes"] <= peak["device_bytes"]
    assert peak["allocated_bytes"] == max(phase["allocated_bytes"] for phase in data["phases"])
    for phase in data["phases"]:
        assert {Category(key) for key in phase["breakdown"]} <= set(LEVEL_CATEGORIES["allocated"])
        assert sum(phase["breakdown"].values()) == phase["allocated_bytes"], phase["name"]
        if phase["name"] == peak["phase"]:
            assert phase["breakdown"] == data["breakdown"]
    levels = data["levels"]
    assert levels["allocator_slack_bytes"] == peak["reserved_bytes"] - peak["allocated_bytes"]
    assert levels["runtime_bytes"] == peak["device_bytes"] - peak["reserved_bytes"] == sum(levels["runtime"].values())


@pytest.mark.parametrize("gpu", GPUS)
def test_fit_and_headroom_with_a_gpu(gpu: str) -> None:
    report = estimate({**WORKLOADS["qlora"], "gpu": gpu})
    data = report.to_dict()
    capacity = resolve_gpu(gpu).memory_bytes
    assert data["gpu"] == {"name": resolve_gpu(gpu).name, "capacity_bytes": capacity}
    # model.py: fits is whether the device level's safe figure fits the GPU and headroom is capacity
    # minus that figure; WORKLOAD.md: `device` is what nvidia-smi shows for the process, per GPU.
    assert is_int(data["headroom_bytes"])
    assert data["headroom_bytes"] == capacity - data["safe"]["device_bytes"]
    assert data["safe"]["device_bytes"] >= data["peak"]["device_bytes"]
    assert isinstance(data["fits"], bool) and data["fits"] == (data["headroom_bytes"] >= 0)
    without_gpu = estimate(WORKLOADS["qlora"]).to_dict()
    assert {k: v for k, v in data.items() if k not in ("gpu", "fits", "headroom_bytes", "workload")} == {
        k: v for k, v in without_gpu.items() if k not in ("gpu", "fits", "headroom_bytes", "workload")
    }


def test_fit_both_ways_for_a_full_fine_tune() -> None:
    assert estimate({"model": MODEL, "gpu": "8GiB"}).fits is False
    assert estimate({"model": MODEL, "gpu": "1TiB"}).fits is True


def test_headroom_and_fit_at_the_boundary() -> None:
    device = hand_report().device_bytes
    assert hand_report().fits is None and hand_report().headroom_bytes is None
    exact = hand_report(capacity=device)
    assert exact.fits is True and exact.headroom_bytes == 0
    short = hand_report(capacity=device - 1)
    assert short.fits is False and short.headroom_bytes == -1
    roomy = hand_report(capacity=80 * GiB).to_dict()
    assert roomy["fits"] is True and roomy["headroom_bytes"] == 80 * GiB - device
    assert roomy["gpu"] == {"name": "toy-gpu", "capacity_bytes": 80 * GiB}


def test_hand_built_report_to_dict() -> None:
    report = hand_report()
    data = report.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["peak"] == {
        "allocated_bytes": 6 * GiB,
        "reserved_bytes": 7 * GiB,
        "device_bytes": 7 * GiB + 512 * MiB,
        "phase": "forward",
    }
    assert data["breakdown"] == {"parameters": 2 * GiB, "activations": 4 * GiB}  # zero categories left out
    assert [p["name"] for p in data["phases"]] == ["forward", "optimizer_step"]
    assert data["phases"][0]["breakdown"] == data["breakdown"]
    assert data["phases"][1]["breakdown"] == {"parameters": 2 * GiB, "gradients": 2 * GiB}
    assert data["levels"] == {
        "allocator_slack_bytes": GiB,
        "runtime_bytes": 512 * MiB,
        "runtime": {"cuda_context": 512 * MiB},
    }
    assert data["workload"] == {"model": "toy", "batch": 1}
    assert data["assumptions"] == [] and data["terms"] == []
    assert report.peak.name == "forward" and report.breakdown[Category.ACTIVATIONS] == 4 * GiB


def test_peak_phase_must_be_a_phase() -> None:
    with pytest.raises(ValueError, match="peak_phase 'backward'"):
        hand_report(peak_phase="backward")


def test_term_formula_is_computed_only_when_asked() -> None:
    calls: list[int] = []

    def explain() -> str:
        calls.append(1)
        return "2 x 3 B"

    term = Term(name="toy", category=Category.TEMPORARY, bytes=6, explain=explain)
    report = hand_report(terms=(term,))
    assert calls == []
    assert report.to_dict()["terms"] == [
        {"name": "toy", "category": "temporary", "bytes": 6, "formula": "2 x 3 B", "alive": ""}
    ]
    assert calls == [1]
    assert Term(name="t", category=Category.OTHER, bytes=1, explain="fixed").formula == "fixed"


def test_terms_of_an_estimate_name_valid_categories() -> None:
    data = estimate(WORKLOADS["lora"]).to_dict()
    peak = data["peak_terms"]
    assert data["terms"] and set(peak) == {"allocated", "allocator", "runtime"}
    for term in [*data["terms"], *peak["allocated"], *peak["allocator"], *peak["runtime"]]:
        assert set(term) == {"name", "category", "bytes", "formula", "alive"}
        assert term["category"] in {c.value for c in Category} and is_int(term["bytes"]) and term["bytes"] >= 0
        assert isinstance(term["formula"], str) and term["formula"] and term["alive"]
    levels = data["peak"]
    assert sum(term["bytes"] for term in peak["allocated"]) == levels["allocated_bytes"]
    assert sum(term["bytes"] for term in peak["allocator"]) == levels["reserved_bytes"] - levels["allocated_bytes"]
    assert sum(term["bytes"] for term in peak["runtime"]) == levels["device_bytes"] - levels["reserved_bytes"]


def test_an_unknown_device_level_is_null_in_the_json() -> None:
    """A measured record without the device level (``device_known=False``): the JSON says null
    for the device peak and the runtime instead of repeating reserved."""
    data = hand_report(engine="measured", device_bytes=7 * GiB, runtime={}, device_known=False).to_dict()
    assert data["peak"]["device_bytes"] is None and data["levels"]["runtime_bytes"] is None
    assert data["peak"]["reserved_bytes"] == 7 * GiB
    assert hand_report().to_dict()["peak"]["device_bytes"] == 7 * GiB + 512 * MiB
