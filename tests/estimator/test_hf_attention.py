"""What ``attention`` means under the hf framework (``estimate/hf_attention.py``).

transformers 5.x resolves an unset ``attn_implementation`` to SDPA and falls back to eager
for a class with ``_supports_sdpa = False`` (Gemma 2), raises for an explicit ``"sdpa"`` on
it, and runs flash-attention 2 only when asked (``modeling_utils.get_correct_attn_implementation``).
"""

from __future__ import annotations

import pytest

from vramlens.errors import InputError
from vramlens.estimator import estimate
from vramlens.model import load_model
from vramlens.model.spec import ModelSpec
from vramlens.resolve.attention import hf_attention_kernel
from vramlens.workload.options import AttentionImpl as A


def _family(model_type: str) -> ModelSpec:
    """A bundled checkpoint of the family (the kernel rule reads the spec's family)."""
    names = {
        "gemma2": "gemma-2-2b",
        "llama": "llama-3.2-1b",
        "gpt2": "gpt2",
        "gemma3_text": "gemma-3-1b-it",
        "phi": "phi-2",
    }
    spec = load_model(names[model_type])
    assert spec.model_type == model_type
    return spec


GEMMA2 = {"model": "gemma-2-2b", "seq": 2048, "batch": 1, "precision": "bf16"}


def test_gemma2_auto_is_eager_with_a_note() -> None:
    kernel, note = hf_attention_kernel(A.AUTO, A.SDPA, _family("gemma2"))
    assert kernel is A.EAGER and "eager" in note


@pytest.mark.parametrize(("requested", "kernel"), [(A.FLASH, A.FLASH), (A.EAGER, A.EAGER)])
def test_gemma2_flash_and_eager_are_what_they_say(requested: A, kernel: A) -> None:
    assert hf_attention_kernel(requested, requested, _family("gemma2"))[0] is kernel


@pytest.mark.parametrize("requested", [A.SDPA, A.EFFICIENT])
def test_gemma2_refuses_sdpa_as_transformers_does(requested: A) -> None:
    with pytest.raises(InputError, match=r"^attention: .* refuses SDPA for gemma2"):
        hf_attention_kernel(requested, requested, _family("gemma2"))


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "gemma3_text", "phi"])
@pytest.mark.parametrize("kernel", [A.SDPA, A.FLASH, A.EFFICIENT, A.EAGER])
def test_families_with_sdpa_keep_the_requested_kernel(model_type: str, kernel: A) -> None:
    assert hf_attention_kernel(A.AUTO, kernel, _family(model_type)) == (kernel, "")


def test_gemma2_auto_estimates_eager_and_flash_is_smaller() -> None:
    auto = estimate({**GEMMA2, "attention": "auto"})
    assert auto.allocated_bytes == estimate({**GEMMA2, "attention": "eager"}).allocated_bytes
    assert any("eager attention" in note for note in auto.assumptions)
    assert estimate({**GEMMA2, "attention": "flash"}).allocated_bytes < auto.allocated_bytes


def test_gemma2_inference_auto_is_eager() -> None:
    infer = {**GEMMA2, "mode": "infer", "prompt": 2048, "generate": 16}
    assert (
        estimate({**infer, "attention": "auto"}).allocated_bytes
        == estimate({**infer, "attention": "eager"}).allocated_bytes
    )


def test_other_frameworks_keep_their_own_kernel() -> None:
    # torchtune's Gemma 2 is its own module code, not transformers': no transformers rule applies.
    assert estimate({**GEMMA2, "framework": "torchtune", "attention": "sdpa"}).allocated_bytes > 0


# ---- SDPA's math backend: fp32 queries with grouped KV heads (validation/measured/2026-11-27-h200) ----

QLORA = {"model": "llama-3.2-1b", "method": "qlora", "precision": "bf16", "batch": 2, "seq": 1024}


def test_fp32_queries_with_grouped_kv_heads_run_the_math_backend_counted_as_eager() -> None:
    """QLoRA without autocast computes in the fp32 of the prepared model; Llama 3.2 groups 32 query
    heads over 8 KV heads, and no fused CUDA kernel takes that in fp32: the s x s probabilities are
    kept (the H200 battery allocated 1.8x the fused-kernel estimate)."""
    math = estimate(QLORA)
    assert any(note.startswith("attention sdpa: fp32 queries") for note in math.assumptions)
    fused = estimate({**QLORA, "versions": {"torch": "2.4"}})  # before enable_gqa: keys repeated, efficient kernel
    eager = estimate({**QLORA, "attention": "eager"})
    assert fused.allocated_bytes < 0.8 * math.allocated_bytes
    assert math.allocated_bytes == pytest.approx(eager.allocated_bytes, rel=0.01)


@pytest.mark.parametrize(
    "change",
    [
        {"precision": "mixed-bf16"},  # autocast hands SDPA bf16: flash
        {"method": "lora"},  # a bf16 base: bf16 queries
        {"model": "gpt2", "method": "full", "precision": "fp32"},  # no grouped KV heads: memory-efficient takes fp32
        {"attention": "flash"},
    ],
    ids=["autocast", "bf16", "no-gqa", "flash"],
)
def test_a_fused_kernel_runs_otherwise(change: dict) -> None:
    report = estimate({**QLORA, **change})
    assert not any(note.startswith("attention sdpa: fp32 queries") for note in report.assumptions)


def test_full_fp32_training_of_a_gqa_model_runs_the_math_backend_too() -> None:
    report = estimate({"model": "qwen2.5-0.5b", "precision": "fp32", "batch": 1, "seq": 512})
    assert any(note.startswith("attention sdpa: fp32 queries") for note in report.assumptions)


def test_fp32_prefill_with_grouped_kv_heads_runs_the_math_backend() -> None:
    """generate() in fp32: the prefill's SDPA call has no mask (sequences padded alike) and grouped
    KV heads, so CUDA runs the math backend, whose s x s scores and probabilities are eager's."""
    prefill = {"model": "llama-3.2-1b", "mode": "infer", "precision": "fp32", "batch": 2, "prompt": 2048, "generate": 8}
    math = estimate(prefill)
    assert any(note.startswith("attention sdpa: fp32 queries") for note in math.assumptions)
    assert math.allocated_bytes == estimate({**prefill, "attention": "eager"}).allocated_bytes
    assert estimate({**prefill, "precision": "bf16"}).allocated_bytes < 0.5 * math.allocated_bytes


def test_a_model_with_sliding_layers_runs_the_math_backend_in_its_global_layers_only() -> None:
    """Gemma 3: five sliding layers of six get a mask (repeated keys, a fused kernel), the global ones
    none (math backend, probabilities kept): those count as eager attention, layer by layer
    (test_activations_hf.py checks each layer kind against autograd under CUDA's backend choice)."""
    gemma = {"model": "gemma-3-1b-it", "precision": "fp32", "batch": 1, "seq": 2048}
    math = estimate(gemma)
    assert any(note.startswith("attention sdpa: fp32 queries") for note in math.assumptions)
    fused = estimate({**gemma, "versions": {"torch": "2.4"}})
    eager = estimate({**gemma, "attention": "eager"})
    assert fused.allocated_bytes < math.allocated_bytes < eager.allocated_bytes
    compiled = estimate({**gemma, "compile": True})
    assert any("under compile" in note for note in compiled.assumptions)
