"""The inference estimator: weights, KV cache and the generation peak for HF generate and vLLM."""

from __future__ import annotations

from dataclasses import dataclass, replace

from vramlens.categories import Category
from vramlens.estimator.infer.context import InferenceContext, resolve_inference
from vramlens.estimator.infer.phases import StagePlan, hf_plan, vllm_plan
from vramlens.estimator.infer.weights import stage_weights
from vramlens.estimator.margins import RUNTIME_SPREAD, runtime_spread, safe_levels
from vramlens.estimator.reserved import allocator_settings, generation_slack, generation_spread
from vramlens.estimator.runtime import communicators, runtime_parts, runtime_terms
from vramlens.hardware import GpuSpec
from vramlens.model.spec import ModelSpec
from vramlens.result.report import MemoryReport, SafeLevels, Term
from vramlens.workload.options import Engine
from vramlens.workload.spec import Workload
from vramlens.workload.versions import older_than

__all__ = ["estimate_inference"]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Levels:
    """The levels above the allocated peak, with the terms each adds."""

    reserved: int
    device: int
    runtime: dict[str, int]
    safe: SafeLevels
    allocator_terms: tuple[Term, ...] = ()
    runtime_terms: tuple[Term, ...] = ()


def _levels(ctx: InferenceContext, plan: StagePlan) -> _Levels:
    """Reserved, device, runtime parts and safe figures above the allocated peak."""
    peak = plan.peak
    parallel = ctx.workload.parallel
    allocated = peak.allocated_bytes
    comms = len(communicators(ctx.workload.parallel))
    if ctx.engine is Engine.VLLM:  # one pool tensor per layer: no allocator slack worth modelling
        device = allocated + sum(plan.runtime.values())
        spread = comms * RUNTIME_SPREAD["nccl_per_communicator"]
        safe = safe_levels(
            allocated=allocated, reserved=allocated, device=device, breakdown=peak.breakdown, allocator_spread=0,
            runtime_spread=spread, pool_bytes=peak.breakdown.get(Category.KV_CACHE, 0),
        )  # fmt: skip
        if plan.serving.kv_pool_bytes is not None:
            # vLLM sizes its pool to gpu_memory_utilization: margins shrink the pool, not the device level.
            safe = replace(safe, allocated_bytes=allocated, reserved_bytes=allocated, device_bytes=device)
        terms = runtime_terms(plan.runtime, parallel)
        return _Levels(reserved=allocated, device=device, runtime=plan.runtime, safe=safe, runtime_terms=terms)
    # Weights are allocated once and never freed; the cache grows by a concatenation per layer and
    # step, which leaves freed blocks one token too short behind (reserved.generation_slack).
    kv = peak.breakdown.get(Category.KV_CACHE, 0)
    settings = allocator_settings(ctx.workload.alloc_conf)
    slack = generation_slack(kv, settings)
    reserved = allocated + slack
    eager = older_than(ctx.workload.versions, "lazy_module_loading")
    runtime = runtime_parts(parallel, eager_modules=eager)
    device = reserved + sum(runtime.values())
    safe = safe_levels(
        allocated=allocated, reserved=reserved, device=device, breakdown=peak.breakdown,
        allocator_spread=generation_spread(kv, settings), runtime_spread=runtime_spread(runtime, comms),
    )  # fmt: skip
    conf = ctx.workload.alloc_conf or "default PYTORCH_CUDA_ALLOC_CONF"
    growth = Term(
        name="allocator slack: the growing KV cache (DynamicCache concatenation)",
        category=Category.ALLOCATOR_SLACK,
        bytes=slack,
        explain=f"KV cache {kv:,} B x fitted fraction (reserved.py KV_GROWTH_FRACTION, {conf})",
        alive="cached blocks, from the decode steps on",
    )
    return _Levels(
        reserved=reserved,
        device=device,
        runtime=runtime,
        safe=safe,
        allocator_terms=(growth,) if slack else (),
        runtime_terms=runtime_terms(runtime, parallel, eager_modules=eager),
    )


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
        from vramlens.estimator.infer.generic import check_generic_inference, generic_hf_plan, generic_stage_weights

        check_generic_inference(ctx)
        plans = [generic_hf_plan(ctx, stage) for stage in generic_stage_weights(ctx)]
    else:
        plans = [
            vllm_plan(ctx, stage, capacity) if ctx.engine is Engine.VLLM else hf_plan(ctx, stage)
            for stage in stage_weights(ctx)
        ]
    plan = max(plans, key=_busiest)
    levels = _levels(ctx, plan)
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
        reserved_bytes=levels.reserved,
        device_bytes=levels.device,
        runtime=levels.runtime,
        terms=tuple(plan.terms),
        allocator_terms=levels.allocator_terms,
        runtime_terms=levels.runtime_terms,
        assumptions=tuple(notes),
        gpu=gpu.name if gpu else None,
        capacity_bytes=capacity,
        serving=plan.serving,
        safe=levels.safe,
    )
