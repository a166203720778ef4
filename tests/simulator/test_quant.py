"""QLoRA on fake tensors: bitsandbytes NF4 storage by hand, the dequantized copy in the peak,
PEFT's 4-bit LoRA forward, refusals, and the estimator against the simulator."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import requires_hf
from vramlens import model_from_config
from vramlens.categories import Category
from vramlens.result.timeline import Timeline
from vramlens.simulator import SimulationError, simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_cases import TINY

pytestmark = [requires_hf, pytest.mark.hf]

MiB = 1024 * 1024
#: Tiny Llama (sim_cases.TINY["llama"]) linears as (out, in): q, k, v, o, gate, up, down.
_LLAMA_LINEARS = [(128, 128), (64, 128), (64, 128), (128, 128), (344, 128), (344, 128), (128, 344)]


def _quant() -> object:
    # ``vramlens.simulator`` is also the name of a function exported by ``vramlens``.
    return importlib.import_module("vramlens.simulator.quant")


def _load_breakdown(timeline: Timeline) -> dict[Category, int]:
    """Tensor-level bytes per category once every pre-existing tensor is registered (the end of
    the first run of ``load`` events; the model's own frees at the end are ``load`` events too)."""
    return timeline.breakdown_at(int(_stretches(timeline, "load")[0][-1]))


def _stretches(timeline: Timeline, phase: str) -> list[np.ndarray]:
    """Runs of consecutive events of ``phase`` (one per micro-step)."""
    indexes = np.flatnonzero(timeline.phase == timeline.phases.index(phase))
    return np.split(indexes, np.flatnonzero(np.diff(indexes) != 1) + 1)


def _qlora(config: dict, **fields: object) -> dict:
    return {"model": model_from_config(dict(config)), "method": "qlora", "framework": "hf", **fields}


def test_one_4096_square_layer_by_hand() -> None:
    quant = _quant()
    n = 4096 * 4096
    # Packed pairs: n / 2 bytes = 8 MiB. Double quantization: one uint8 absmax per 64 elements
    # (262,144 B), one fp32 scale per 256 absmax (1,024 x 4 B), the 0-dim fp32 offset, the 256-entry
    # fp32 nested code book and the 16-entry fp32 NF4 code book.
    assert quant.nf4_linear_bytes(4096, 4096, double_quant=True) == 8 * MiB + n // 64 + 1024 * 4 + 4 + 1024 + 64
    # Plain NF4: one fp32 absmax per 64 elements (1 MiB) and the code book.
    assert quant.nf4_linear_bytes(4096, 4096, double_quant=False) == 8 * MiB + n // 64 * 4 + 64
    shapes = quant.nf4_tensor_shapes(3, 5, double_quant=True)
    assert shapes["weight"][0] == (8, 1)  # 15 elements round up to 8 bytes
    assert shapes["absmax"][0] == (1,) and shapes["nested_absmax"][0] == (1,)


def _hand_parameters(config: dict, *, double_quant: bool, rank: int, fp32_rest: bool) -> int:
    quant = _quant()
    layers = config["num_hidden_layers"]
    quantized = layers * sum(quant.nf4_linear_bytes(o, i, double_quant=double_quant) for o, i in _LLAMA_LINEARS)
    adapters = layers * sum(rank * (o + i) * 4 for o, i in _LLAMA_LINEARS)  # PEFT keeps LoRA in fp32
    h = config["hidden_size"]
    rest = 2 * config["vocab_size"] * h + (2 * layers + 1) * h  # embedding, LM head (unquantized), norms
    return quantized + adapters + rest * (4 if fp32_rest else 2)


@pytest.mark.parametrize(("quant", "double_quant"), [("none", True), ("nf4", False), ("nf4-dq", True)])
def test_tiny_llama_qlora_parameters_by_hand(quant: str, double_quant: bool) -> None:
    config = TINY["llama"]
    report = simulate(_qlora(config, quant=quant, batch=1, seq=16), steps=1)
    assert report.timeline is not None
    parameters = _load_breakdown(report.timeline)[Category.PARAMETERS]
    assert parameters == _hand_parameters(config, double_quant=double_quant, rank=16, fp32_rest=True)


def test_without_kbit_preparation_the_rest_stays_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_quant(), "PREPARE_KBIT_TRAINING", False)
    config = TINY["llama"]
    report = simulate(_qlora(config, batch=1, seq=16), steps=1)
    assert report.timeline is not None
    parameters = _load_breakdown(report.timeline)[Category.PARAMETERS]
    assert parameters == _hand_parameters(config, double_quant=True, rank=16, fp32_rest=False)


#: A Llama whose MLP weights (8192 x 256 = 2 Mi elements, 4 MiB in bf16) dwarf a short batch's activations.
_WIDE = {**TINY["llama"], "hidden_size": 256, "intermediate_size": 8192}


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_dequantized_weight_is_in_the_peak_forward_and_backward(recompute: str) -> None:
    timeline = simulate(_qlora(_WIDE, batch=1, seq=8, recompute=recompute)).timeline
    assert timeline is not None
    copy = 8192 * 256 * 2  # the largest linear, dequantized to bf16
    copies = _WIDE["num_hidden_layers"] * 3  # gate, up and down have 8192 x 256 elements
    forward, backward = _stretches(timeline, "forward")[-1], _stretches(timeline, "backward")[-1]
    sizes = timeline.nbytes
    # One copy per linear in forward, one more in backward for grad_input (two with recompute).
    assert np.count_nonzero(sizes[forward] == copy) == copies
    assert np.count_nonzero(sizes[backward] == copy) == copies * (2 if recompute == "full" else 1)
    # Each copy is freed before the next is made: they alternate, never two alive at once.
    signs = np.sign(sizes[forward][np.abs(sizes[forward]) == copy])
    assert list(signs) == [1, -1] * copies
    # The forward's peak holds what was live when it began plus a whole dequantized weight.
    live = timeline.live_bytes
    assert int(live[forward].max()) >= int(live[forward[0] - 1]) + copy


def _tiny_lora_layer(out_features: int, in_features: int) -> tuple[object, object]:
    """A one-linear PEFT model over an NF4 base (real CPU tensors, uninitialized), and the quant module."""
    import collections

    import peft
    import torch

    quant = _quant()
    with torch.device("meta"):
        linear = torch.nn.Linear(in_features, out_features, bias=False, dtype=torch.bfloat16)
    model = torch.nn.Sequential(collections.OrderedDict(proj=linear))
    model = quant.quantize_model(model, quant.Nf4Settings(double_quant=True, compute_dtype=torch.bfloat16))
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["proj"]))
    assert quant.use_bnb_lora_forward(model) == 1
    return model.to_empty(device="cpu"), quant


def test_matmul_4bit_dequantizes_twice_and_saves_nothing_on_a_real_cpu_run() -> None:
    import torch

    from vramlens.trace.tracker import MemoryTracker

    model, _ = _tiny_lora_layer(512, 256)
    x = torch.randn(4, 256, dtype=torch.bfloat16, requires_grad=True)
    tracker = MemoryTracker()
    tracker.register_model(model)
    tracker.register(x)
    with tracker:
        model(x).float().sum().backward()
    timeline = tracker.timeline()
    names = np.array([timeline.modules[code] if code >= 0 else "" for code in timeline.module])

    def sizes(phase: str, module: str) -> list[int]:
        where = (timeline.phase == timeline.phases.index(phase)) & np.char.endswith(names.astype(str), module)
        return [int(size) for size in timeline.nbytes[where]]

    absmax, weight, out = 512 * 256 // 64 * 4, 512 * 256 * 2, 4 * 512 * 2
    # Forward: fp32 absmax, the bf16 weight, absmax freed, the output, the weight freed (nothing kept).
    assert sizes("forward", "proj.base_layer") == [absmax, weight, -absmax, out, -weight]
    # PEFT's bnb forward clones the base output first (and the original is dropped).
    assert sizes("forward", ".proj")[:2] == [out, -out]
    # Backward: dequantized again for grad_input (4 x 256 bf16), then freed.
    assert sizes("backward", "proj.base_layer")[:5] == [absmax, weight, -absmax, 4 * 256 * 2, -weight]


def test_nf4_inference_dequantizes_in_prefill_and_not_in_a_one_token_decode() -> None:
    config = TINY["llama"]
    fields = {"mode": "infer", "quant": "nf4", "precision": "bf16", "batch": 1, "prompt": 32, "generate": 8}
    report = simulate({"model": model_from_config(dict(config)), **fields})
    timeline = report.timeline
    assert timeline is not None
    parameters = _load_breakdown(timeline)[Category.PARAMETERS]
    assert parameters == _hand_parameters(config, double_quant=False, rank=0, fp32_rest=False)
    copy = 344 * 128 * 2  # gate/up/down dequantized to bf16
    prefill, decode = (np.flatnonzero(timeline.phase == timeline.phases.index(p)) for p in ("prefill", "decode"))
    assert np.count_nonzero(timeline.nbytes[prefill] == copy) == 3 * config["num_hidden_layers"]
    # One token: gemv_4bit reads the packed weight, except for down_proj, whose 344 inputs are not a
    # multiple of the 64-element block (bitsandbytes then falls back to MatMul4Bit).
    assert np.count_nonzero(timeline.nbytes[decode] == copy) == config["num_hidden_layers"]
    assert any(note.startswith("quant: 14 linears as bitsandbytes NF4") for note in report.assumptions)


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"method": "qlora", "quant": "gptq-int4"}, "quant"),
        ({"method": "lora", "quant": "awq-int4"}, "quant"),
        ({"mode": "infer", "quant": "gptq-int4"}, "quant"),
        ({"mode": "infer", "quant": "int8"}, "quant"),
    ],
)
def test_other_quantization_is_refused_in_one_line(fields: dict, key: str) -> None:
    with pytest.raises(SimulationError) as caught:
        simulate({"model": model_from_config(dict(TINY["llama"])), "batch": 1, "seq": 32, **fields})
    message = str(caught.value)
    assert message.startswith(f"{key}:") and "vramlens estimate" in message and "\n" not in message


#: Recipes: PEFT's QLoRA guide (``prepare_model_for_kbit_training``: the simulator's and the hf
#: profile's default), and without that step (TRL >= 0.27, sharded QLoRA).
_RECIPES = {"kbit-prepared": True, "no-kbit-prep": False}
_AGREEMENT = [
    ("llama-3.2-1b", "full", "kbit-prepared", {}, None),
    ("llama-3.2-1b", "none", "kbit-prepared", {}, None),
    ("qwen2.5-0.5b", "full", "kbit-prepared", {}, None),
    ("qwen2.5-0.5b", "none", "kbit-prepared", {}, None),
    ("qwen3-0.6b", "none", "kbit-prepared", {}, None),
    ("llama-3.1-8b", "full", "kbit-prepared", {}, None),
    ("llama-3.1-8b", "none", "kbit-prepared", {}, None),
    ("llama-3.1-70b", "full", "kbit-prepared", {}, None),
    ("llama-3.2-1b", "none", "kbit-prepared", {"precision": "bf16"}, None),
    ("llama-3.2-1b", "full", "no-kbit-prep", {}, None),
    ("llama-3.2-1b", "none", "no-kbit-prep", {}, None),
    ("qwen2.5-0.5b", "none", "no-kbit-prep", {}, None),
    ("llama-3.1-8b", "none", "no-kbit-prep", {}, None),
    ("llama-3.1-70b", "full", "no-kbit-prep", {}, None),
    # MoE experts (fused 3-D parameters) stay unquantized: bf16 without preparation, fp32 with it.
    ("qwen1.5-moe-a2.7b", "none", "no-kbit-prep", {}, None),
    ("qwen1.5-moe-a2.7b", "none", "kbit-prepared", {}, None),
    ("llama-3.2-1b", "none", "kbit-prepared", {"lora": {"dropout": 0.05}}, None),
    # A plain MLP (the down adapter keeps a bf16 cast of the fp32 activation) and Conv1D linears.
    ("gpt2", "none", "kbit-prepared", {"seq": 1024}, None),
    # A fused qkv projection: its fp32 output reaches SDPA as casts, so no buffer is kept behind a view.
    ("pythia-1b", "none", "kbit-prepared", {}, None),
]


def _estimator_recipe(model: str, prepared: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch the hf profile's k-bit preparation (the workload has no key for it) and drop the
    catalog spec's memo, which holds the profile of earlier estimates."""
    import dataclasses

    from vramlens.model.resolve import load_model
    from vramlens.resolve import frameworks
    from vramlens.workload.options import Framework

    profile = dataclasses.replace(frameworks.FRAMEWORKS[Framework.HF], kbit_prepare=prepared)
    monkeypatch.setitem(frameworks.FRAMEWORKS, Framework.HF, profile)
    load_model(model).derived_cache.clear()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "recompute", "recipe", "fields"),
    [
        pytest.param(
            model,
            recompute,
            recipe,
            fields,
            marks=[why] if why else [],
            id="-".join([model, recompute, recipe, *(f"{key}={value}" for key, value in fields.items())]),
        )
        for model, recompute, recipe, fields, why in _AGREEMENT
    ],
)
def test_estimate_within_3_percent_of_the_qlora_simulation(
    model: str, recompute: str, recipe: str, fields: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vramlens.estimator import estimate

    monkeypatch.setattr(_quant(), "PREPARE_KBIT_TRAINING", _RECIPES[recipe])
    _estimator_recipe(model, _RECIPES[recipe], monkeypatch)
    workload = {"model": model, "method": "qlora", "batch": 1, "seq": 2048, "recompute": recompute, "framework": "hf"}
    workload.update(fields)
    simulated = simulate(workload)
    try:
        assert estimate(workload).allocated_bytes == pytest.approx(simulated.allocated_bytes, rel=0.03)
    finally:
        _estimator_recipe(model, True, monkeypatch)


@pytest.mark.parametrize("recipe", sorted(_RECIPES))
@pytest.mark.parametrize("quant", ["nf4", "nf4-dq"])
@pytest.mark.parametrize("family", ["llama", "qwen2 (tied, qkv bias)", "qwen3 (qk norm)"])
def test_estimated_parameters_equal_the_simulated_bytes(
    family: str, quant: str, recipe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The estimator's parameter bytes (4-bit weights with their quant state, adapters,
    unquantized weights in their dtype) are the simulator's to the byte."""
    import dataclasses

    from vramlens.estimator import estimate
    from vramlens.resolve import frameworks
    from vramlens.workload.options import Framework

    prepared = _RECIPES[recipe]
    monkeypatch.setattr(_quant(), "PREPARE_KBIT_TRAINING", prepared)
    profile = dataclasses.replace(frameworks.FRAMEWORKS[Framework.HF], kbit_prepare=prepared)
    monkeypatch.setitem(frameworks.FRAMEWORKS, Framework.HF, profile)
    config = TINY[family]
    report = simulate(_qlora(config, quant=quant, batch=1, seq=16), steps=1)
    assert report.timeline is not None
    simulated = _load_breakdown(report.timeline)[Category.PARAMETERS]
    estimated = {term.name: term.bytes for term in estimate(_qlora(config, quant=quant, batch=1, seq=16)).terms}
    assert estimated["parameters"] == simulated
