"""Agreement: the analytic estimator within 3% of the simulator's allocated peak (issue 5).

The simulator runs transformers' real code on fake tensors, so on these workloads it is
the reference: every disagreement beyond 3% is a bug in one of the two engines. The set
spans seven families (Llama, Qwen2, Qwen3, Gemma 3, OLMo 2, GPT-NeoX, Phi), full and LoRA
training, bf16 / fp32 / mixed-bf16, no and full recompute, foreach and fused AdamW, and
sequence lengths 512 to 8192 (each within the model's context). Known disagreements that
are not in the set (Gemma 2's attention kernel, GPT-2's composed GELU) are listed in
``docs/simulate.md``.
"""

from __future__ import annotations

import pytest

from conftest import requires_hf
from vramlens.estimate import estimate
from vramlens.simulate import simulate

pytestmark = [requires_hf, pytest.mark.hf]

_VARIANTS = {
    "bf16 s2048": {"precision": "bf16", "seq": 2048},
    "mixed+recompute s512": {"precision": "mixed-bf16", "seq": 512, "recompute": "full"},
    "lora bf16 s4096": {"precision": "bf16", "seq": 4096, "method": "lora"},
    "fp32 foreach s1024": {"precision": "fp32", "seq": 1024, "optimizer_impl": "foreach"},
    "lora+recompute s8192": {"precision": "bf16", "seq": 8192, "method": "lora", "recompute": "full"},
}
_MODELS = {
    "llama-3.2-1b": list(_VARIANTS),
    "qwen2.5-0.5b": list(_VARIANTS),
    "qwen3-0.6b": list(_VARIANTS),
    "gemma-3-270m": list(_VARIANTS),
    "olmo-2-1b": ["bf16 s2048", "mixed+recompute s512", "lora bf16 s4096", "fp32 foreach s1024"],
    "qwen2.5-1.5b": ["bf16 s2048", "mixed+recompute s512", "lora bf16 s4096", "fp32 foreach s1024"],
    "pythia-1b": ["bf16 s2048", "mixed+recompute s512", "fp32 foreach s1024"],
    "phi-2": ["bf16 s2048", "mixed+recompute s512", "fp32 foreach s1024"],
}
_CASES = [(model, variant) for model, variants in _MODELS.items() for variant in variants]
_FAST = {("llama-3.2-1b", "mixed+recompute s512")}


def test_the_set_is_large_and_varied() -> None:
    assert len(_CASES) >= 30
    assert len(_MODELS) >= 7


@pytest.mark.parametrize(
    ("model", "variant"),
    [pytest.param(*case, marks=() if case in _FAST else (pytest.mark.slow,), id="-".join(case)) for case in _CASES],
)
def test_estimate_within_3_percent_of_the_simulation(model: str, variant: str) -> None:
    workload = {"model": model, "batch": 1, "framework": "hf", **_VARIANTS[variant]}
    simulated = simulate(workload)
    estimated = estimate(workload)
    assert estimated.allocated_bytes == pytest.approx(simulated.allocated_bytes, rel=0.03)
