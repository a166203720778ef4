"""The inference estimator: weights, KV cache and the generation peak for HF generate and vLLM."""

from __future__ import annotations

from vramlens.categories import Category
from vramlens.estimate.frameworks import profile_for
from vramlens.estimate.infer.context import InferenceContext, resolve_inference
from vramlens.estimate.infer.phases import StagePlan, hf_plan, vllm_plan
from vramlens.estimate.infer.weights import stage_weights
from vramlens.estimate.runtime import runtime_memory
from vramlens.hardware import GpuSpec
from vramlens.model.spec import ModelSpec
from vramlens.report.model import MemoryReport, Term
from vramlens.workload.options import Engine, Framework
from vramlens.workload.spec import Workload

__all__ = ["estimate_inference"]


def _levels(ctx: InferenceContext, plan: StagePlan) -> tuple[int, int, dict[str, int]]:
    """(reserved, device, runtime parts) above the allocated peak."""
    allocated = plan.peak.allocated_bytes
    if ctx.engine is Engine.VLLM:  # one pool tensor per layer: no allocator slack worth modelling
        return allocated, allocated + sum(plan.runtime.values()), plan.runtime
    # Weights are allocated once and never freed, so only the churning part (cache growth,
    # activations, logits) leaves freed blocks behind in the caching allocator.
    churn = allocated - plan.peak.breakdown.get(Category.PARAMETERS, 0)
    profile, _ = profile_for(Framework.HF)
    runtime = runtime_memory(churn, fragmentation=profile.fragmentation, gpus=ctx.workload.parallel.gpus)
    reserved = allocated + runtime.allocator_slack
    return reserved, reserved + runtime.runtime_bytes, runtime.runtime


def _busiest(plan: StagePlan) -> int:
    """Order of stages: the least KV pool left over (vLLM with a GPU), else the highest peak."""
    pool = plan.serving.kv_pool_bytes
    return plan.serving.kv_bytes_needed - pool if pool is not None else plan.peak.allocated_bytes


def estimate_inference(spec: ModelSpec, workload: Workload, *, gpu: GpuSpec | None = None) -> MemoryReport:
    """Per-GPU memory of generating with ``workload`` on ``spec`` (busiest rank), checked
    against ``gpu`` when one is given."""
    ctx = resolve_inference(spec, workload, gpu)
    capacity = gpu.memory_bytes if gpu else None
    if spec.generic is not None:
        from vramlens.estimate.infer.generic import check_generic_inference, generic_hf_plan, generic_stage_weights

        check_generic_inference(ctx)
        plans = [generic_hf_plan(ctx, stage) for stage in generic_stage_weights(ctx)]
    else:
        plans = [
            vllm_plan(ctx, stage, capacity) if ctx.engine is Engine.VLLM else hf_plan(ctx, stage)
            for stage in stage_weights(ctx)
        ]
    plan = max(plans, key=_busiest)
    reserved, device, runtime = _levels(ctx, plan)
    notes = [*ctx.assumptions, *plan.notes]
    peak = plan.peak
    notes.append(f"peak: {peak.name} ({peak.note})")
    return MemoryReport(
        engine="estimate",
        model=spec.name,
        workload=workload,
        phases=tuple(plan.phases),
        peak_phase=peak.name,
        allocated_bytes=peak.allocated_bytes,
        reserved_bytes=reserved,
        device_bytes=device,
        runtime=runtime,
        terms=tuple(Term(name=n, category=c, bytes=b, explain=f) for n, c, b, f in plan.terms),
        assumptions=tuple(notes),
        gpu=gpu.name if gpu else None,
        capacity_bytes=capacity,
        serving=plan.serving,
    )
