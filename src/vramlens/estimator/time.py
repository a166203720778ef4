"""Step time: an analytic model of how long one optimizer step takes, to rank configurations.

``step_time(workload)`` adds, per GPU, for one optimizer step (all ``grad_accum``
micro-batches):

* compute: model FLOPs (:mod:`vramlens.estimator.time_flops`) over the GPU's peak at
  the compute precision times :data:`~vramlens.estimator.time_tables.MFU`, plus
  QLoRA/k-bit dequantisation (memory-bound);
* recompute: the forward FLOPs repeated by activation checkpointing;
* optimizer: the update step, memory-bound on the GPU (or on the CPU when offloaded);
* communication: the exposed part of DP/ZeRO/FSDP, TP, PP, CP and EP traffic
  (:mod:`vramlens.estimator.time_comm`);
* offload: PCIe traffic of offloaded optimizer state, parameters and activations;
* bubble: the pipeline bubble ``(pp-1)/m`` of the compute, ``m = grad_accum``.

Inference: one batch of prefill and decode steps (:mod:`vramlens.estimator.time_infer`).

It ranks, it does not promise: constants are round published figures
(:mod:`vramlens.estimator.time_tables`), kernels, launch overheads, data loading and
stragglers are not modeled. Pure, deterministic, ~0.05 ms per call.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.estimator.time_comm import Traffic, communication, offload_traffic
from vramlens.estimator.time_flops import micro_batch_flops, moe_expert_bytes_note, trainable_parameters
from vramlens.estimator.time_infer import inference_parts
from vramlens.estimator.time_tables import (
    DEFAULT_GPU,
    MEMORY_EFFICIENCY,
    MFU,
    OPTIMIZER_BYTES_PER_PARAM,
    SATURATION_TOKENS,
)
from vramlens.hardware import GpuSpec, resolve_gpu
from vramlens.model.resolve import load_model
from vramlens.model.spec import ModelSpec
from vramlens.result.report import MemoryReport
from vramlens.workload.options import Method, Mode, Offload, Precision, Quant
from vramlens.workload.spec import Workload

__all__ = ["StepTime", "peak_flops", "step_time"]

_PEAK_KEYS: dict[Precision, tuple[str, ...]] = {
    Precision.FP32: ("tf32", "fp32"),
    Precision.BF16: ("bf16", "fp16"),
    Precision.MIXED_BF16: ("bf16", "fp16"),
    Precision.FP16: ("fp16", "bf16"),
    Precision.MIXED_FP16: ("fp16", "bf16"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTime:
    """Seconds of one optimizer step on one GPU, by part. Ranks configurations; not a promise."""

    seconds: float
    """The whole step: the sum of the parts below."""
    compute_s: float
    """Forward and backward matmuls and attention (incl. k-bit dequantisation), all micro-batches."""
    recompute_s: float
    """Forward work repeated by activation checkpointing."""
    optimizer_s: float
    """The optimizer update (GPU, memory-bound; or CPU when offloaded)."""
    communication_s: float
    """Collective and point-to-point traffic not hidden behind compute."""
    offload_s: float
    """PCIe traffic of offloaded optimizer state, parameters or activations not hidden behind compute."""
    bubble_s: float
    """Pipeline bubble: idle stage time, ``(pp-1)/m`` of the compute."""
    flops: int
    """Model FLOPs of the whole step, all GPUs (forward + backward + recompute)."""
    communication_bytes: int = 0
    """Bytes one GPU sends over NVLink/network in the step (before overlap)."""
    gpu: str = ""
    """The GPU whose peak FLOPs and bandwidths were used."""
    notes: tuple[str, ...] = ()


def peak_flops(gpu: GpuSpec, precision: Precision) -> float | None:
    """Dense peak FLOP/s at the compute precision (fp32 runs on TF32 tensor cores when present).

    TF32 for fp32: the seed 004 measurement (bf16 2.7x faster than fp32) fits a ~2x
    TF32-to-bf16 peak ratio plus doubled memory traffic, not the ~15x of fp32 CUDA cores.
    """
    for key in _PEAK_KEYS[precision]:
        value = gpu.peak_dense_flops.get(key)
        if value:
            return float(value)
    return None


def _gpu(workload: Workload, notes: list[str]) -> tuple[GpuSpec, float]:
    gpu = resolve_gpu(workload.gpu) if workload.gpu is not None else None
    peak = peak_flops(gpu, workload.precision) if gpu is not None else None
    if gpu is None or peak is None or not gpu.memory_bandwidth_bytes_per_s:
        fallback = resolve_gpu(DEFAULT_GPU)
        what = "no gpu given" if gpu is None else f"{gpu.name} has no peak FLOPs/bandwidth in the table"
        notes.append(f"time: {what}; FLOPs and bandwidths of {fallback.name} are used")
        gpu, peak = fallback, peak_flops(fallback, workload.precision)
    assert peak is not None
    return gpu, peak


def _optimizer_seconds(spec: ModelSpec, workload: Workload, gpu: GpuSpec, notes: list[str]) -> float:
    """Memory-bound GPU update of this rank's share of the trainable parameters (0 when offloaded)."""
    if workload.parallel.offload is not Offload.NONE:
        return 0.0
    par = workload.parallel
    shard = trainable_parameters(spec, workload) / (par.tp * par.pp * par.shard_group)
    per_param = OPTIMIZER_BYTES_PER_PARAM.get(str(workload.optimizer), OPTIMIZER_BYTES_PER_PARAM["default"])
    if "8bit" in str(workload.optimizer) or "paged" in str(workload.optimizer):
        notes.append("time: 8-bit/paged optimizers are modeled at the speed of 32-bit AdamW")
    bandwidth = float(gpu.memory_bandwidth_bytes_per_s or 0) * MEMORY_EFFICIENCY
    return shard * per_param / bandwidth


def _dequant_seconds(spec: ModelSpec, workload: Workload, gpu: GpuSpec, passes: float) -> float:
    """k-bit weights are dequantised to the compute dtype on every pass: read ~0.5-1 B, write 2 B per weight."""
    if workload.quant is Quant.NONE and workload.method is not Method.QLORA:
        return 0.0
    par = workload.parallel
    weights = spec.num_parameters / (par.tp * par.pp)
    bandwidth = float(gpu.memory_bandwidth_bytes_per_s or 0) * MEMORY_EFFICIENCY
    return weights * 2.5 * passes / bandwidth


def _training_time(spec: ModelSpec, workload: Workload, notes: list[str]) -> StepTime:
    gpu, peak = _gpu(workload, notes)
    par = workload.parallel
    tokens = workload.batch * workload.seq
    micro = micro_batch_flops(spec, workload, tokens)
    model_parallel = par.tp * par.pp * par.cp
    per_gpu_tokens = tokens / (par.tp * par.cp)
    rate = peak * MFU * per_gpu_tokens / (per_gpu_tokens + SATURATION_TOKENS)
    if workload.float8:
        notes.append("time: float8 matmuls are not sped up in this model (bf16 peak used)")
    steps = workload.grad_accum
    compute = (micro.forward + micro.backward) / model_parallel / rate * steps
    recompute = micro.recompute / model_parallel / rate * steps
    recompute_passes = micro.recompute / max(micro.forward, 1.0)
    compute += _dequant_seconds(spec, workload, gpu, (2.0 + recompute_passes) * steps)
    bubble = (par.pp - 1) / steps * (compute + recompute) if par.pp > 1 else 0.0
    comm: Traffic = communication(spec, workload, gpu, compute + recompute)
    offload: Traffic = offload_traffic(spec, workload, gpu, compute + recompute)
    optimizer = _optimizer_seconds(spec, workload, gpu, notes) + offload.cpu_seconds
    notes.extend(comm.notes + offload.notes)
    moe = moe_expert_bytes_note(spec)
    if moe:
        notes.append(moe)
    flops = micro.total * steps * par.dp
    parts = (compute, recompute, optimizer, comm.exposed_s, offload.exposed_s, bubble)
    return StepTime(
        seconds=sum(parts),
        compute_s=compute,
        recompute_s=recompute,
        optimizer_s=optimizer,
        communication_s=comm.exposed_s,
        offload_s=offload.exposed_s,
        bubble_s=bubble,
        flops=round(flops),
        communication_bytes=round(comm.bytes),
        gpu=gpu.name,
        notes=tuple(notes),
    )


def _inference_time(spec: ModelSpec, workload: Workload, notes: list[str]) -> StepTime:
    """Prefill + decode of one batch (:mod:`vramlens.estimator.time_infer`): both in ``compute_s``."""
    gpu, peak = _gpu(workload, notes)
    parts = inference_parts(spec, workload, gpu, peak)
    notes.append(
        f"time: inference of one batch: prefill {parts.prefill_s:.3g} s + {workload.generate} decode steps "
        f"{parts.decode_s:.3g} s (memory- or compute-bound, whichever is slower); launch latency not modeled"
    )
    compute = parts.prefill_s + parts.decode_s
    return StepTime(
        seconds=compute + parts.communication_s,
        compute_s=compute,
        recompute_s=0.0,
        optimizer_s=0.0,
        communication_s=parts.communication_s,
        offload_s=0.0,
        bubble_s=0.0,
        flops=round(parts.flops),
        communication_bytes=round(parts.communication_bytes),
        gpu=gpu.name,
        notes=tuple(notes),
    )


def step_time(workload: Workload, report: MemoryReport | None = None) -> StepTime:
    """Seconds of one optimizer step of a training ``workload`` on one GPU, by part (see module doc).

    Inference workloads get the time of one batch of ``batch`` sequences instead: prefill
    plus ``generate`` decode steps, both in ``compute_s`` (:mod:`vramlens.estimator.time_infer`;
    a note gives the split). ``report`` (the workload's memory estimate) is accepted for
    callers that have one; the model does not need it.
    """
    del report
    spec = load_model(workload.model)
    if workload.mode is Mode.INFER:
        return _inference_time(spec, workload, [])
    return _training_time(spec, workload, [])
