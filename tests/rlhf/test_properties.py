"""Properties over random setups: the peak is the largest phase, and offloading a model never
adds GPU memory to any phase (it only removes the model's resident state where it is idle)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramlens.rlhf import Algo, Placement, load_rlhf, rlhf_estimate

_ALGOS = [a.value for a in Algo]
_MODELS = ["qwen2.5-0.5b", "llama-3.2-1b", "gpt2"]


@st.composite
def setups(draw: st.DrawFn) -> dict[str, Any]:
    algo = draw(st.sampled_from(_ALGOS))
    actor = draw(st.sampled_from(_MODELS))
    data: dict[str, Any] = {
        "algo": algo,
        "actor": {"model": actor, "method": draw(st.sampled_from(["full", "lora"]))},
        "gpu": draw(st.sampled_from(["h100-80gb", "rtx-4090"])),
        "gpus": draw(st.sampled_from([1, 2, 4])),
        "prompt": draw(st.integers(16, 512)),
        "response": draw(st.integers(16, 512)),
        "rollout_batch": draw(st.integers(1, 16)),
        "micro_batch": draw(st.integers(1, 4)),
        "rollout": {"engine": draw(st.sampled_from(["hf", "vllm"])), "placement": "colocated"},
    }
    if algo in ("grpo", "rloo"):
        data["group_size"] = draw(st.integers(2, 8))
    if algo in ("ppo", "rloo", "online-dpo") or (draw(st.booleans()) and algo == "grpo"):
        data["reward"] = draw(st.sampled_from(_MODELS))
    if draw(st.booleans()):
        data["shard"] = "zero3"
    return data


def _roles(report: Any) -> list[str]:
    return [role for role in report.phases[0].models if role != "rollout" or report.setup.rollout.own_weights]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setups())
def test_peak_is_the_largest_phase_and_offloading_never_adds_memory(data: dict[str, Any]) -> None:
    report = rlhf_estimate(load_rlhf(data), recommend=False)
    assert report.peak_device_bytes == max(p.device_bytes for p in report.phases)
    assert report.peak_allocated_bytes == max(p.allocated_bytes for p in report.phases)
    assert report.peak_reserved_bytes == max(p.reserved_bytes for p in report.phases)
    assert report.peak.device_bytes == report.peak_device_bytes
    assert report.fits == (report.peak_device_bytes <= report.capacity_bytes)
    for phase in report.phases:
        assert phase.allocated_bytes <= phase.reserved_bytes <= phase.device_bytes
    for role in _roles(report):
        offloaded = rlhf_estimate(load_rlhf(data, offload=[role]), recommend=False)
        assert offloaded.setup.placement_of(role) is Placement.OFFLOAD
        for before, after in zip(report.phases, offloaded.phases, strict=True):
            assert before.name == after.name
            assert after.allocated_bytes <= before.allocated_bytes, (role, after.name)
            assert after.reserved_bytes <= before.reserved_bytes, (role, after.name)
            assert after.device_bytes <= before.device_bytes, (role, after.name)
        assert offloaded.peak_device_bytes <= report.peak_device_bytes
