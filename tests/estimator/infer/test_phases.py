"""Inference phases: transformers prefill/decode peaks, eager attention's score matrix, and vLLM's
profile run, KV pool and concurrency (against the memory-profiling log of vllm PR #10511)."""

from __future__ import annotations

from typing import Any

import pytest

from vramlens.categories import Category
from vramlens.estimator import estimate
from vramlens.estimator.infer.engines import VLLM
from vramlens.result.report import MemoryReport, ServingCapacity
from vramlens.units import GiB

LLAMA = "llama-3.1-8b"
PER_TOKEN = 131_072  # Llama-3.1-8B / Llama-3-8B, bf16 (see test_kv_cache.py)


def infer(model: str = LLAMA, **workload: Any) -> MemoryReport:
    return estimate({"model": model, "mode": "infer", **workload})


def term(report: MemoryReport, name: str) -> int:
    return next(t.bytes for t in report.terms if t.name == name)


def phase(report: MemoryReport, name: str) -> dict[Category, int]:
    return dict(next(p for p in report.phases if p.name == name).breakdown)


def serving(report: MemoryReport) -> ServingCapacity:
    assert report.serving is not None
    return report.serving


# ---- transformers generate() -------------------------------------------------------------------


def test_hf_has_prefill_and_decode() -> None:
    assert [p.name for p in infer(prompt=512, generate=64).phases] == ["prefill", "decode"]


@pytest.mark.parametrize("workload", [{"prompt": 512, "generate": 0}, {"context": 512}], ids=["generate-0", "context"])
def test_hf_without_generated_tokens_has_only_prefill(workload: dict[str, Any]) -> None:
    assert [p.name for p in infer(**workload).phases] == ["prefill"]


def test_hf_kv_grows_from_prompt_to_context() -> None:
    report = infer(batch=2, prompt=1000, generate=200)
    assert phase(report, "prefill")[Category.KV_CACHE] == 2 * 1000 * PER_TOKEN
    assert phase(report, "decode")[Category.KV_CACHE] == 2 * 1200 * PER_TOKEN
    assert serving(report).kv_bytes_needed == 2 * 1200 * PER_TOKEN


def test_long_prompt_peaks_at_prefill() -> None:
    report = infer(batch=1, prompt=8192, generate=16)
    assert report.peak_phase == "prefill"
    assert report.allocated_bytes == max(p.allocated_bytes for p in report.phases)


def test_long_generation_with_short_prompt_peaks_at_decode() -> None:
    report = infer(batch=1, prompt=16, generate=8192)
    assert report.peak_phase == "decode"
    assert phase(report, "decode")[Category.KV_CACHE] > 100 * phase(report, "prefill")[Category.KV_CACHE]


def test_hf_weights_are_in_every_phase() -> None:
    report = infer(prompt=512, generate=64)
    assert {phase(report, p.name)[Category.PARAMETERS] for p in report.phases} == {term(report, "weights")}


def test_eager_attention_adds_the_score_matrix() -> None:
    # Llama-3.1-8B, batch 1, prompt 4096, bf16: 32 heads (of 128), 8 KV heads, hidden 4096, intermediate 14336.
    b, s, heads, kv, hd, h, i, c = 1, 4096, 32, 8, 128, 4096, 14336, 2
    t = b * s
    rotary = 2 * hd  # cos and sin, held by the model for every layer
    held_attention = t * (3 * h + rotary)  # inputs_embeds, the residual (layer input), the normed input
    held_mlp = t * (4 * h + rotary)  # ... and the layer input beside the rebound residual
    attention = t * (hd * (2 * heads + 3 * kv) + h)  # q, k, v, rotary q/k copies, attention out, o_proj out
    mlp = 3 * t * i  # act(gate), up, their product
    eager_attention = 3 * t * heads * hd  # rotary q and the keys/values repeated to every head
    scores = b * heads * s * s * (c + 4 + 4)  # bf16 scores, their float32 copy and the float32 softmax
    mask = b * s * s * c  # one additive mask, shared by the layers
    sdpa = infer(batch=b, prompt=s, generate=0, attention="sdpa")
    eager = infer(batch=b, prompt=s, generate=0, attention="eager")
    assert phase(sdpa, "prefill")[Category.ACTIVATIONS] == max(attention + held_attention, mlp + held_mlp) * c
    assert phase(eager, "prefill")[Category.ACTIVATIONS] == (eager_attention + held_attention) * c + scores + mask
    assert phase(eager, "prefill")[Category.ACTIVATIONS] >= b * heads * s**2 * (c + 8)
    # The sdpa peak is the MLP, so the step up is the eager attention's lead over it.
    step = (eager_attention + held_attention) * c + scores + mask - (mlp + held_mlp) * c
    assert eager.allocated_bytes - sdpa.allocated_bytes == step


def test_gpt2_prefill_holds_its_python_references_and_gelu_new_temporaries() -> None:
    # GPT-2, batch 1, prompt 1000, bf16: hidden 768, intermediate 3072, 12 heads of 64.
    # During the MLP: wte and wpe outputs (locals of GPT2Model.forward), the block's input (the
    # caller's loop variable) and attn_output (a local of GPT2Block.forward), the residual and ln_2's
    # output: 6 x h; NewGELUActivation has c_fc's output, 0.5 * x and two temporaries alive: 4 x i.
    t, h, i, c = 1000, 768, 3072, 2
    mlp = t * (6 * h + 4 * i) * c
    attention = t * (64 * (2 * 12 + 3 * 12) + h + 4 * h) * c  # q/k/v, copies, outputs + 4 held tensors
    assert mlp > attention
    report = infer("gpt2", batch=1, prompt=t, generate=8)
    assert phase(report, "prefill")[Category.ACTIVATIONS] == mlp == 33_792_000


def test_sliding_window_layers_hold_the_whole_prompt_after_the_prefill() -> None:
    # gemma-3-270m: 18 layers (every 6th global, the others a 512-token window), 1 KV head of 256:
    # 1024 B per token and layer in bf16. DynamicSlidingWindowLayer keeps a view of the prefill's
    # concatenated keys/values, so every layer holds all 1000 prompt tokens until the first decode step.
    report = infer("gemma-3-270m", batch=1, prompt=1000, generate=8)
    assert phase(report, "prefill")[Category.KV_CACHE] == 18 * 1000 * 1024
    assert phase(report, "decode")[Category.KV_CACHE] == (3 * 1008 + 15 * 512) * 1024


def test_a_one_token_prompt_peaks_at_the_lm_head_not_beside_it() -> None:
    # Prompt 1: the last layer's working set is smaller than the LM head's moment (the final hidden
    # state, the bf16 logits and their float32 copy); the two are never alive at once.
    report = infer(batch=1, prompt=1, generate=8)
    prefill = phase(report, "prefill")
    assert prefill[Category.TEMPORARY] == 128_256 * (2 + 4)
    assert prefill[Category.ACTIVATIONS] == 4096 * 2


def test_auto_attention_is_sdpa_in_hf() -> None:
    assert infer(attention="auto").allocated_bytes == infer(attention="sdpa").allocated_bytes


# ---- vLLM with a GPU ---------------------------------------------------------------------------

H100 = {"engine": "vllm", "gpu": "h100-80gb"}


def test_vllm_budget_is_utilization_times_capacity() -> None:
    report = infer(**H100)
    assert report.capacity_bytes is not None
    assert serving(report).budget_bytes == int(0.9 * report.capacity_bytes)
    half = infer(**H100, gpu_memory_utilization=0.5)
    assert serving(half).budget_bytes == int(0.5 * report.capacity_bytes)


def test_vllm_pool_is_the_budget_minus_everything_else() -> None:
    report = infer(**H100, parallel={"tp": 2, "gpus": 2})
    got = serving(report)
    assert got.budget_bytes is not None and got.kv_pool_bytes is not None
    rest = term(report, "weights") + term(report, "profile activation peak") + sum(report.runtime.values())
    assert got.kv_pool_bytes == got.budget_bytes - rest
    assert set(report.runtime) == {"cuda_context_and_kernels", "cuda_graphs", "nccl_and_custom_allreduce"}
    assert term(report, "KV pool") == got.kv_pool_bytes


def test_vllm_device_level_stays_within_the_gpu() -> None:
    report = infer(**H100)
    assert report.capacity_bytes is not None
    assert report.device_bytes <= report.capacity_bytes
    assert report.device_bytes == serving(report).budget_bytes
    assert report.peak_phase == "serving" and report.fits is True


def test_vllm_blocks_and_concurrency() -> None:
    report = infer(**H100, batch=4, context=32768)
    got = serving(report)
    assert got.kv_pool_bytes is not None
    per_sequence = 32768 * PER_TOKEN  # 32768 is a whole number of 16-token blocks
    assert got.kv_block_bytes == 16 * PER_TOKEN
    assert got.kv_blocks == got.kv_pool_bytes // (16 * PER_TOKEN)
    assert got.max_concurrent_sequences == min(256, got.kv_pool_bytes // per_sequence) == 13


def test_vllm_concurrency_is_capped_by_max_num_seqs() -> None:
    got = serving(infer(**H100, batch=2, prompt=100, generate=28, max_num_seqs=64))
    assert got.max_concurrent_sequences == 64


def test_vllm_does_not_fit_when_the_sequences_outgrow_the_pool() -> None:
    report = infer(**H100, batch=32, context=32768)  # 32 x 4 GiB of KV > the ~53 GiB pool
    got = serving(report)
    assert got.kv_pool_bytes is not None and got.kv_bytes_needed > got.kv_pool_bytes
    assert got.fits is False and report.fits is False
    # the engine still starts (one 4 GiB sequence fits the pool); the headroom is the GPU's, not the pool's
    assert got.engine_starts is True
    assert report.headroom_bytes == (report.capacity_bytes or 0) - report.device_bytes >= 0


def test_vllm_weights_beyond_the_budget_leave_no_pool() -> None:
    report = infer("llama-3-70b", **H100)  # 131 GiB of bf16 weights on one 80 GB GPU
    got = serving(report)
    assert got.kv_pool_bytes is not None and got.kv_pool_bytes < 0
    assert got.kv_blocks == 0 and got.max_concurrent_sequences == 0
    assert report.fits is False and got.engine_starts is False


def test_vllm_without_a_gpu_shows_the_kv_needed() -> None:
    report = infer(engine="vllm", batch=3, context=1000)
    got = serving(report)
    assert got.kv_pool_bytes is None and got.budget_bytes is None and report.fits is None
    assert phase(report, "serving")[Category.KV_CACHE] == got.kv_bytes_needed == 3 * 1008 * PER_TOKEN


# ---- vLLM against its own memory-profiling log ----------------------------------------------------
# vllm-project/vllm PR #10511, comment of 2024-12-14, `vllm serve meta-llama/Meta-Llama-3-8B` on an H100:
#   total_gpu_memory 79.22GiB, gpu_memory_utilization 0.90, the current vLLM instance can use 71.29GiB,
#   model weights take 14.96GiB, non_torch_memory 1.79GiB, PyTorch activation peak memory 1.26GiB,
#   available_kv_cache_memory 53.29GiB.
# With -tp 2: model weights 7.48GiB, non_torch_memory 3.58GiB, activation peak 1.26GiB.
# That vLLM did not yet count CUDA graphs inside the budget; vramlens reserves 0.36 GiB for them.


def test_the_logged_pool_is_the_budget_minus_its_parts() -> None:
    available = 71.29 - 14.96 - 1.79 - 1.26  # budget - weights - non-torch - activation peak
    assert available == pytest.approx(53.29, abs=0.01)


def test_vllm_activation_peak_matches_the_log() -> None:
    report = infer("llama-3-8b", **H100)  # 8192 batched tokens and 256 sequences: the defaults
    assert term(report, "profile activation peak") / GiB == pytest.approx(1.26, rel=0.10)


def test_vllm_pool_matches_the_log_less_cuda_graphs() -> None:
    report = infer("llama-3-8b", **H100)
    got = serving(report)
    assert got.kv_pool_bytes is not None and got.budget_bytes is not None
    assert report.runtime["cuda_context_and_kernels"] / GiB == pytest.approx(1.79, abs=0.005)
    assert report.runtime["cuda_graphs"] / GiB == pytest.approx(0.36, abs=0.005)
    assert got.budget_bytes / GiB == pytest.approx(71.29, abs=0.1)
    assert abs(got.kv_pool_bytes / GiB - (53.29 - 0.36)) < 1.0


def test_vllm_tp2_matches_the_log() -> None:
    report = infer("llama-3-8b", **H100, parallel={"tp": 2, "gpus": 2})
    non_torch = report.runtime["cuda_context_and_kernels"] + report.runtime["nccl_and_custom_allreduce"]
    assert non_torch / GiB == pytest.approx(3.58, abs=0.01)
    assert term(report, "profile activation peak") / GiB == pytest.approx(1.26, rel=0.10)


def test_vllm_batched_tokens_default_depends_on_the_gpu() -> None:
    h100 = infer("llama-3-8b", **H100)
    a100 = infer("llama-3-8b", engine="vllm", gpu="a100-80gb")
    assert f"max_num_batched_tokens: {VLLM.max_num_batched_tokens}" in " ".join(h100.assumptions)
    assert f"max_num_batched_tokens: {VLLM.small_gpu_batched_tokens}" in " ".join(a100.assumptions)


def test_vllm_forward_step_grows_with_batched_tokens() -> None:
    # With a handful of sequences the sampler is small and one layer's forward is the profile peak.
    small = infer(engine="vllm", max_num_seqs=4, batch=1, max_num_batched_tokens=8192)
    large = infer(engine="vllm", max_num_seqs=4, batch=1, max_num_batched_tokens=16384)
    assert term(large, "profile activation peak") == 2 * term(small, "profile activation peak")
