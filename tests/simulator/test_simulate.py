"""The simulator against real tracked CPU runs (byte-exact) and hand arithmetic; its refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import requires_hf
from vramlens import model_from_config
from vramlens.categories import Category
from vramlens.errors import ConfigError, InputError
from vramlens.result.timeline import Timeline
from vramlens.simulator import SimulationError, simulate
from vramlens.simulator.report import allocated_timeline

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_cases import TINY, real_training_peak, workload

pytestmark = [requires_hf, pytest.mark.hf]

_STEPS = {
    "bf16": {"precision": "bf16"},
    "fp32": {"precision": "fp32"},
    "mixed-bf16 (autocast)": {"precision": "mixed-bf16"},
    "bf16 + full recompute": {"precision": "bf16", "recompute": True},
    "LoRA bf16": {"precision": "bf16", "lora": True},
    "LoRA mixed + recompute": {"precision": "mixed-bf16", "lora": True, "recompute": True},
}
_FAST = {("llama", "bf16"), ("qwen2 (tied, qkv bias)", "LoRA bf16")}


def _cases() -> list[object]:
    cases = []
    for family in TINY:
        for step in _STEPS:
            marks: tuple[object, ...] = () if (family, step) in _FAST else (pytest.mark.slow,)
            cases.append(pytest.param(family, step, marks=marks, id=f"{family}-{step}"))
    return cases


@pytest.mark.parametrize(("family", "step"), _cases())
def test_fake_peak_equals_the_real_tracked_peak_to_the_byte(family: str, step: str) -> None:
    fields = dict(_STEPS[step])
    config = TINY[family]
    real = real_training_peak(
        config,
        precision=fields["precision"],
        recompute=fields.get("recompute", False),
        lora=fields.get("lora", False),
        batch=2,
        seq=64,
    )
    report = simulate(workload(config, batch=2, seq=64, **fields))
    assert report.timeline is not None
    assert report.timeline.peak_bytes == real


def test_adafactor_fake_peak_equals_the_real_tracked_peak() -> None:
    """torch's Adafactor reads values (``.item()``) that fake tensors lack; the simulator lets
    them read 1, which changes no allocation: the peak still matches a real run to the byte."""
    config = TINY["llama"]
    real = real_training_peak(
        config, precision="bf16", recompute=False, lora=False, batch=2, seq=64, optimizer="adafactor"
    )
    fields = {"precision": "bf16", "optimizer": "adafactor", "optimizer_impl": "per-tensor"}
    report = simulate(workload(config, batch=2, seq=64, **fields))
    assert report.timeline is not None and report.timeline.peak_bytes == real


def test_allocated_level_rounds_each_tensor_to_512_bytes() -> None:
    # 1 B -> 512, 1000 B -> 1024, 512 B -> 512; frees mirror their allocations.
    nbytes = np.array([1, 1000, 512, -1000, -1, -512], dtype=np.int64)
    n = len(nbytes)
    timeline = Timeline(
        time=np.arange(n, dtype=np.int64),
        nbytes=nbytes,
        category=np.zeros(n, dtype=np.int8),
        phase=np.full(n, -1, dtype=np.int32),
        module=np.full(n, -1, dtype=np.int32),
        stack=np.full(n, -1, dtype=np.int32),
        storage=np.array([0, 1, 2, 1, 0, 2], dtype=np.int64),
    )
    rounded = allocated_timeline(timeline)
    assert rounded.nbytes.tolist() == [512, 1024, 512, -1024, -512, -512]
    assert rounded.peak_bytes == 2048 and rounded.end_bytes == 0 and rounded.level == "allocated"


def test_report_levels_and_phases() -> None:
    report = simulate(workload(TINY["llama"], batch=2, seq=64, precision="bf16"))
    assert report.engine == "simulate"
    assert [phase.name for phase in report.phases] == ["forward", "backward", "optimizer_step"]
    assert report.allocated_bytes == max(phase.allocated_bytes for phase in report.phases)
    assert report.device_bytes > report.reserved_bytes >= report.allocated_bytes > report.timeline.peak_bytes
    for phase in report.phases:
        assert sum(phase.breakdown.values()) == phase.allocated_bytes
    # Parameters by hand: embed 1000x128, 2 layers of q,o 128x128, k,v 64x128, gate/up/down 344x128,
    # two norms of 128, final norm 128, untied head 1000x128; bf16 = 2 B each, 512-B blocks per tensor.
    assert report.breakdown[Category.PARAMETERS] >= 2 * (
        2 * 1000 * 128 + 2 * (2 * 128 * 128 + 2 * 64 * 128 + 3 * 344 * 128)
    )
    assert report.to_dict()["timeline"]["events"] == len(report.timeline)


def test_inference_kv_cache_by_hand() -> None:
    config = TINY["llama"]
    report = simulate(
        {
            "model": model_from_config(dict(config)),
            "mode": "infer",
            "batch": 2,
            "prompt": 48,
            "generate": 16,
            "precision": "bf16",
        }
    )
    assert [phase.name for phase in report.phases] == ["prefill", "decode"]
    prefill = next(phase for phase in report.phases if phase.name == "prefill")
    # 2 layers x (K + V) x batch 2 x 2 KV heads x 48 tokens x head_dim 32 x 2 B (bf16); each tensor
    # is 12,288 B, already a multiple of 512.
    assert prefill.breakdown[Category.KV_CACHE] == 2 * 2 * 2 * 2 * 48 * 32 * 2
    decode = next(phase for phase in report.phases if phase.name == "decode")
    # At least the full cache of 63 (then 64) tokens per layer.
    assert decode.breakdown[Category.KV_CACHE] >= 2 * 2 * 2 * 2 * 63 * 32 * 2


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"mode": "infer", "engine": "vllm"}, "engine"),
        ({"parallel": {"gpus": 2, "shard": "ddp"}}, "parallel.shard"),
        ({"parallel": {"gpus": 2, "tp": 2}}, "parallel"),
        ({"method": "qlora", "quant": "gptq-int4"}, "quant"),
        ({"compile": True}, "compile"),
        ({"optimizer": "lion"}, "optimizer"),
        ({"recompute": "selective"}, "recompute"),
        ({"framework": "torchtitan"}, "framework"),
    ],
)
def test_what_cannot_be_simulated_is_refused_with_a_hint(fields: dict, key: str) -> None:
    with pytest.raises(SimulationError) as caught:
        simulate({"model": model_from_config(dict(TINY["llama"])), "batch": 1, "seq": 32, **fields})
    message = str(caught.value)
    assert message.startswith(f"{key}:") and "vramlens estimate" in message and "\n" not in message


def test_a_model_transformers_cannot_build_is_refused() -> None:
    import dataclasses

    spec = model_from_config(dict(TINY["llama"]))
    foreign = dataclasses.replace(spec, config={**TINY["llama"], "model_type": "not-a-transformers-model"})
    with pytest.raises(SimulationError, match=r"^model_type: .*vramlens estimate"):
        simulate({"model": foreign, "batch": 1, "seq": 32})


def test_an_unknown_model_type_is_refused_before_simulating() -> None:
    with pytest.raises(ConfigError, match=r"model_type 'not-a-transformers-model' is known neither"):
        model_from_config({**TINY["llama"], "model_type": "not-a-transformers-model"})


def test_a_spec_without_config_is_refused() -> None:
    import dataclasses

    spec = dataclasses.replace(model_from_config(dict(TINY["llama"])), config=None)
    with pytest.raises(SimulationError, match=r"^model: .*config"):
        simulate({"model": spec, "batch": 1, "seq": 32})


def test_bad_steps_is_an_input_error() -> None:
    with pytest.raises(InputError, match=r"^steps: "):
        simulate({"model": model_from_config(dict(TINY["llama"])), "batch": 1, "seq": 32}, steps=0)


def test_meta_models_are_built_without_running_the_initialisers() -> None:
    """While a model is built on the meta device, torch.nn.init's initialisers hand their tensor
    back as it is (simulator/build.py _no_meta_init); outside, they are torch's own again."""
    import torch

    from vramlens.simulator.build import _no_meta_init

    original = torch.nn.init.kaiming_uniform_
    weight = torch.empty(4, 4, device="meta")
    with _no_meta_init(torch):
        assert torch.nn.init.kaiming_uniform_(weight, a=5**0.5) is weight
        assert torch.nn.init.kaiming_uniform_ is not original
        layer = torch.nn.Linear(3, 5, device="meta")
    assert torch.nn.init.kaiming_uniform_ is original
    assert layer.weight.shape == (5, 3) and layer.bias is not None and layer.bias.shape == (5,)
