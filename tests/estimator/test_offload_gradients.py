"""With the optimizer offloaded, DeepSpeed and FSDP keep the gradient partitions in CPU memory
(stage3.py: ``grad_partitions_flat_buffer`` on the optimizer's device, the CPU); the GPU holds
DeepSpeed's reduce bucket(s) only (allocated with or without offload). It used to keep every gradient on the GPU (14.96 GiB bf16 / 29.9 GiB fp32 for
an 8B model on one GPU), so the planner found no offload setup that fits a 24 GB card."""

from __future__ import annotations

from typing import Any

from vramlens.categories import Category
from vramlens.estimator import estimate
from vramlens.model.resolve import load_model
from vramlens.planner import plan
from vramlens.workload import load_workload

SPEC = load_model("llama-3.1-8b")
BUCKET = SPEC.hidden_size**2  # reduce_bucket_size "auto" as the HF Trainer fills it


def _grads(workload: dict[str, Any]) -> tuple[int, dict[str, int]]:
    report = estimate({"model": "llama-3.1-8b", "batch": 1, "seq": 512, **workload})
    terms = {t.name: t.bytes for t in report.terms if t.category is Category.GRADIENTS}
    step = next(p for p in report.phases if p.name == "optimizer_step")
    return step.breakdown.get(Category.GRADIENTS, 0), terms


def test_zero3_offload_keeps_only_the_reduce_bucket() -> None:
    step, terms = _grads({"framework": "deepspeed", "parallel": {"shard": "zero3", "offload": "optimizer+params"}})
    assert terms == {"ZeRO reduce buckets": BUCKET * 2}
    assert step == BUCKET * 2  # bf16 gradients (DeepSpeed's bf16 params), nothing else at the step
    step_hf, _ = _grads({"parallel": {"shard": "zero3", "offload": "optimizer"}})
    assert step_hf == BUCKET * 4  # HF autocast: fp32 parameters, fp32 gradients


def test_zero2_offload_keeps_two_buckets_and_the_largest_parameter() -> None:
    _, terms = _grads({"framework": "deepspeed", "parallel": {"shard": "zero2", "offload": "optimizer"}})
    largest = SPEC.vocab_size * SPEC.hidden_size
    assert terms == {"ZeRO reduce buckets": (2 * BUCKET + largest) * 2}


def test_fsdp_offload_keeps_no_sharded_gradient_and_no_offload_is_unchanged() -> None:
    step, terms = _grads({"parallel": {"shard": "fsdp", "offload": "optimizer+params"}})  # FSDP CPUOffload
    assert step == 0 and terms == {}
    _, sharded = _grads({"framework": "deepspeed", "parallel": {"gpus": 8, "shard": "zero3"}})
    # without offload the partitions stay on the GPU; the reduce bucket is there either way
    assert sharded == {"gradients (model)": SPEC.num_parameters * 2 // 8, "ZeRO reduce buckets": BUCKET * 2}


def test_the_planner_finds_offload_setups_that_fit_a_24gb_card() -> None:
    result = plan(load_workload({"model": "llama-3.1-8b", "gpu": "rtx-4090"}), max_candidates=3)
    assert result.candidates, result.impossible
    assert all(dict((k, v) for k, _, v in c.changes).get("parallel.offload") is not None for c in result.candidates)
