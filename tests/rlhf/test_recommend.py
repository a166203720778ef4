"""Recommendations are setup changes that really lower the peak: applying each one's
``changes`` through ``load_rlhf`` and estimating again gives the peak minus ``saves_bytes``."""

from __future__ import annotations

from typing import Any

import pytest

from vramlens.rlhf import load_rlhf, rlhf_estimate


def _apply(data: dict[str, Any], changes: tuple[tuple[str, Any, Any], ...]) -> dict[str, Any]:
    out = dict(data)
    for key, _, new in changes:
        block, _, name = key.rpartition(".")
        if block:
            current = out.get(block)
            merged = {"model": current} if isinstance(current, str) else dict(current or {})
            out[block] = {**merged, name: new}
        else:
            out[key] = new
    return out


CASES = [
    {"algo": "ppo", "actor": "qwen2.5-1.5b", "gpu": "24GiB", "micro_batch": 2, "prompt": 256, "response": 256},
    {"algo": "ppo", "actor": "qwen2.5-1.5b", "gpu": "24GiB", "gpus": 4, "prompt": 256, "response": 256},
    {"algo": "grpo", "actor": "qwen2.5-1.5b", "gpu": "24GiB", "rollout": {"engine": "vllm", "placement": "colocated",
     "gpu_memory_utilization": 0.6}, "group_size": 4, "micro_batch": 1, "prompt": 128, "response": 128},
]  # fmt: skip


@pytest.mark.parametrize("data", CASES)
def test_each_recommendation_saves_what_it_says(data: dict[str, Any]) -> None:
    report = rlhf_estimate(load_rlhf(data), plan=True)
    assert not report.fits and report.recommendations
    for rec in report.recommendations:
        assert rec.saves_bytes > 0 and "\n" not in rec.text
        changed = rlhf_estimate(load_rlhf(_apply(data, rec.changes)), recommend=False)
        assert changed.peak_device_bytes == report.peak_device_bytes - rec.saves_bytes, rec.text
    saved = [r.saves_bytes for r in report.recommendations]
    need = report.peak_device_bytes - report.capacity_bytes
    fitting = [s >= need for s in saved]
    assert fitting == sorted(fitting, reverse=True)  # those that make it fit come first


def test_offloading_the_idle_models_is_offered_and_sized() -> None:
    data = CASES[0]
    report = rlhf_estimate(load_rlhf(data))
    keys = {key for rec in report.recommendations for key, _, _ in rec.changes}
    assert {"reward.placement", "reference.placement"} <= keys
    single = next(r for r in report.recommendations if r.changes == (("reference.placement", "colocated", "offload"),))
    reference = report.peak.models["reference"].bytes
    assert 0 < single.saves_bytes <= reference
