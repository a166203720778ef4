"""Data, tensor and pipeline parallelism in the persistent terms, by hand.

llama-3.1-8b (N = 8,030,261,248 parameters), precision mixed-bf16, full fine-tune, 8 GPUs.
Bytes per parameter of the two mixed-precision styles (``MixedStyle`` in frameworks.py):

* torchtitan (FSDP2 ``MixedPrecisionPolicy``): fp32 parameters 4, fp32 gradients 4,
  AdamW moments 2 x 4;
* deepspeed (ZeRO docs: "2 bytes params + (2 bf16 grads + 4 fp32 grads + 12 optimizer) / N"):
  bf16 parameters 2, bf16 gradients 2, moments 2 x 4, fp32 master 4, fp32 gradient partition 4.

Which of them are split over the shard group (ZeRO paper, stage by stage): ZeRO-1 the
optimizer state (and master weights), ZeRO-2 also the gradients, ZeRO-3/FSDP/HSDP also
the parameters; DDP splits nothing and adds one bucket copy of every gradient. Tensor
parallelism splits attention, MLP and vocabulary matrices and replicates norms.
Pipeline stages: ``micro_batches_in_flight`` from its docstring (1F1B ``min(pp, m)``, GPipe
``m``, interleaved with two chunks ``min(pp, m) * (1 + (pp - 1) / (2 pp))``).
"""

from __future__ import annotations

import pytest

from vramlens.categories import Category
from vramlens.estimator import estimate
from vramlens.estimator.layout import micro_batches_in_flight
from vramlens.model.resolve import load_model
from vramlens.result.report import MemoryReport
from vramlens.workload.options import PipelineSchedule

MODEL = "llama-3.1-8b"
N = 8_030_261_248

#: framework -> bytes per element of (parameters, gradients, optimizer state, fp32 master).
_BYTES = {"torchtitan": (4, 4, 8, 0), "deepspeed": (2, 2, 8, 4)}
#: shard -> divisors of (parameters, gradients, optimizer state) with 8 data-parallel ranks.
_DIVISORS = {
    "ddp": (1, 1, 1),
    "zero1": (1, 1, 8),
    "zero2": (1, 8, 8),
    "zero3": (8, 8, 8),
    "fsdp": (8, 8, 8),
}


def _report(framework: str, **parallel: object) -> MemoryReport:
    workload = {
        "model": MODEL,
        "framework": framework,
        "precision": "mixed-bf16",
        "batch": 1,
        "seq": 512,
        "parallel": {"gpus": 8, **parallel},
    }
    return estimate(workload)


def _persistent(report: MemoryReport) -> dict[str, int]:
    names = ("parameters", "gradients (model)", "optimizer state (model)", "fp32 master weights (model)")
    return {t.name: t.bytes for t in report.terms if t.name in names or t.name == "DDP gradient buckets"}


def _expected(framework: str, divisors: tuple[int, int, int]) -> dict[str, int]:
    (p, g, s, m), (dp, dg, ds) = _BYTES[framework], divisors
    expected = {
        "parameters": N * p // dp,
        "gradients (model)": N * g // dg,
        "optimizer state (model)": N * s // ds,
    }
    if m:
        expected["fp32 master weights (model)"] = N * m // ds  # partitioned with the state
    return expected


def test_model_size() -> None:
    assert load_model(MODEL).num_parameters == N


@pytest.mark.parametrize("framework", list(_BYTES))
@pytest.mark.parametrize("shard", list(_DIVISORS))
def test_sharding_divides_the_right_terms(framework: str, shard: str) -> None:
    expected = _expected(framework, _DIVISORS[shard])
    if shard == "ddp":
        # One bucket copy of every gradient (gradient_as_bucket_view=False).
        expected["DDP gradient buckets"] = expected["gradients (model)"]
    assert _persistent(_report(framework, shard=shard)) == expected


def test_sharding_figures_spelled_out() -> None:
    # torchtitan FSDP: 4N/8 params, 4N/8 grads, 8N/8 moments.
    assert _expected("torchtitan", _DIVISORS["fsdp"]) == {
        "parameters": 4_015_130_624,
        "gradients (model)": 4_015_130_624,
        "optimizer state (model)": 8_030_261_248,
    }
    # deepspeed ZeRO-2: bf16 params 2N, grads 2N/8, moments 8N/8, master 4N/8.
    assert _expected("deepspeed", _DIVISORS["zero2"])["gradients (model)"] == 2_007_565_312


@pytest.mark.parametrize("shard", ["zero1", "zero2", "zero3"])
def test_deepspeed_fp32_gradient_partition_follows_the_state(shard: str) -> None:
    terms = {t.name: t.bytes for t in _report("deepspeed", shard=shard).terms}
    # The optimizer steps on an fp32 copy of its partition of the gradients: 4N / 8 (ZeRO-3: of its
    # largest sub group, here the whole 1.0e9-element partition, beside its bf16 flattened copy).
    if shard != "zero3":
        assert terms["fp32 gradient partition (master-weight optimizer step)"] == 4 * N // 8
        return
    assert terms["fp32 gradients of the largest optimizer sub group (ZeRO-3)"] == 4 * (N // 8)
    assert terms["the sub group's flattened gradients, cast to fp32 (ZeRO-3 _prepare_fp32_grad_for_sub_group)"] == 2 * (
        N // 8
    )


def test_hsdp_shards_over_the_shard_group_only() -> None:
    # 8 GPUs, shard_degree 4: two replicas, each sharded 4 ways.
    terms = _persistent(_report("torchtitan", shard="hsdp", shard_degree=4))
    assert terms == {
        "parameters": 4 * N // 4,
        "gradients (model)": 4 * N // 4,
        "optimizer state (model)": 8 * N // 4,  # 16,060,522,496 B
    }


@pytest.mark.parametrize(("framework", "shard"), [("torchtitan", "fsdp"), ("deepspeed", "zero2")])
def test_optimizer_offload_leaves_no_state_on_the_gpu(framework: str, shard: str) -> None:
    report = _report(framework, shard=shard, offload="optimizer")
    assert not [t.name for t in report.terms if t.category is Category.OPTIMIZER_STATE]
    assert not [t.name for t in report.terms if "step temporaries" in t.name or "gradient partition" in t.name]
    # Parameters stay where the shard strategy puts them; FSDP (no optimizer-only offload of its own)
    # keeps its gradient shards, DeepSpeed moves the gradient partitions to the CPU with the optimizer
    # (stage_1_and_2.py) and keeps two reduce buckets and the largest parameter's buffer.
    expected = _expected(framework, _DIVISORS[shard])
    terms = _persistent(report)
    assert terms["parameters"] == expected["parameters"]
    if framework == "deepspeed":
        assert "gradients (model)" not in terms
        assert any(t.name == "ZeRO reduce buckets" for t in report.terms)
    else:
        assert terms["gradients (model)"] == expected["gradients (model)"]


def test_parameter_offload_leaves_no_resident_parameters() -> None:
    report = _report("torchtitan", shard="fsdp", offload="optimizer+params")
    assert "parameters" not in _persistent(report)
    assert any(t.name.startswith("unsharded parameters") for t in report.terms)


# ---- tensor parallelism ------------------------------------------------------------------------


def test_tensor_parallel_splits_matrices_and_replicates_norms() -> None:
    b = load_model(MODEL).parameter_breakdown
    assert b.norms == 32 * 2 * 4096 and b.final_norm == 4096
    # Attention, MLP, embedding and untied head split 8 ways; 65 RMSNorm weights replicated.
    split = (b.attention + b.mlp + b.embedding + b.lm_head) // 8
    per_rank = split + b.norms + b.final_norm
    assert per_rank == (N - 266_240) // 8 + 266_240 == 1_004_015_616
    assert per_rank / (N / 8) == pytest.approx(1, rel=1e-3)  # 0.03% over N/8
    terms = {t.name: t.bytes for t in _report("torchtitan", tp=8).terms}
    assert terms["gradients (model)"] == 4 * per_rank  # fp32 gradients
    assert terms["optimizer state (model)"] == 8 * per_rank
    # torchtitan + TP uses the vocabulary-parallel loss on V/8 = 16,032 columns: 512 x (2+12) x 16,032.
    assert terms["logits and loss (at the loss)"] == 512 * 14 * (128_256 // 8) == 114_917_376


# ---- pipeline parallelism ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "pp", "m", "expected"),
    [
        (PipelineSchedule.ONE_F_ONE_B, 8, 32, 8),  # warm-up 7 forwards + 1: min(8, 32)
        (PipelineSchedule.GPIPE, 8, 32, 32),  # all forwards before any backward
        # rank 0 warms up (2-1)*8 + 2*(8-1) = 22 half-stage chunks, +1 before the first
        # backward = 23 halves = 11.5 micro-batches = 8 * (1 + 7/16)
        (PipelineSchedule.INTERLEAVED_1F1B, 8, 32, 11.5),
        (PipelineSchedule.ONE_F_ONE_B, 8, 3, 3),  # fewer micro-batches than stages
        (PipelineSchedule.ONE_F_ONE_B, 1, 32, 1),  # no pipeline
        (PipelineSchedule.GPIPE, 1, 32, 1),
    ],
)
def test_micro_batches_in_flight(schedule: PipelineSchedule, pp: int, m: int, expected: float) -> None:
    assert micro_batches_in_flight(schedule, pp, m) == expected
    if schedule is PipelineSchedule.INTERLEAVED_1F1B:
        assert expected == ((2 - 1) * pp + 2 * (pp - 1) + 1) / 2 == 8 * (1 + 7 / 16)


def _pipeline(grad_accum: int) -> MemoryReport:
    workload = {"model": MODEL, "batch": 1, "seq": 1024, "grad_accum": grad_accum, "parallel": {"gpus": 4, "pp": 4}}
    return estimate(workload)


def _saved_activations(report: MemoryReport) -> int:
    return next(t.bytes for t in report.terms if t.name == "activations (saved for backward)")


def test_pipeline_activations_scale_with_micro_batches_in_flight() -> None:
    one, eight = _pipeline(1), _pipeline(8)
    # grad_accum 8 on 4 stages: 1F1B keeps min(4, 8) = 4 micro-batches on the first stage,
    # which is then the busier stage and is the one reported (at 1024 tokens; at 512 the last
    # stage's head weight copy and logits still outweigh them).
    assert any("reporting the first pipeline stage" in line for line in eight.assumptions)
    # grad_accum 1: one micro-batch everywhere; the last stage (head, logits) is busier. Its
    # 8 layers (24-31) save exactly what the first stage's 8 layers (0-7) save: the layers are alike.
    assert any("reporting the last pipeline stage" in line for line in one.assumptions)
    assert _saved_activations(eight) == 4 * _saved_activations(one)
    term = next(t for t in eight.terms if t.name == "activations (saved for backward)")
    assert "4 micro-batch(es) in flight (8 layers)" in term.formula
