"""Inference time of one request batch: prefill, then ``generate`` decode steps.

* Prefill: ``batch x prompt`` tokens of forward FLOPs (matmuls and the causal attention
  core, :mod:`vramlens.estimator.time_flops`) at the training MFU.
* Decode: each step reads every weight of the rank and the whole KV cache once and does
  ``batch`` tokens of forward FLOPs; a step takes the longer of the memory time (at
  :data:`~vramlens.estimator.time_tables.MEMORY_EFFICIENCY` of HBM bandwidth) and the
  compute time (the roofline; Williams et al. 2009). The KV cache is taken at the mean
  context of the decode phase, ``prompt + generate/2`` (capped by sliding windows).
* TP: 2 all-reduces of the step's ``tokens x h`` activations per layer (forward only).

Weight bytes per parameter follow the quantisation (bf16 2, int8/fp8 1, 4-bit 0.5, fp32 4);
KV bytes the ``kv_dtype``. Kernel launch latency, which dominates small decode steps,
scheduling and batching policies of vLLM are not modeled: it ranks, it does not promise.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.estimator.infer.kv_cache import layer_kv_limit
from vramlens.estimator.time_comm import inter_bandwidth, intra_bandwidth
from vramlens.estimator.time_flops import attention_core_flops, layer_matmul_parameters
from vramlens.estimator.time_tables import GPUS_PER_NODE, MEMORY_EFFICIENCY, MFU, SATURATION_TOKENS
from vramlens.hardware import GpuSpec
from vramlens.model.quant_formats import QUANT_FORMATS
from vramlens.model.spec import ModelSpec
from vramlens.workload.options import KvDtype, Precision, Quant
from vramlens.workload.spec import Workload

__all__ = ["InferenceParts", "inference_parts"]

#: Bytes a matmul reads per quantized weight element (bits / 8; side tensors ignored).
_WEIGHT_BYTES: dict[Quant, float] = {quant: fmt.bits / 8 for quant, fmt in QUANT_FORMATS.items()}


@dataclass(frozen=True, kw_only=True, slots=True)
class InferenceParts:
    """Seconds of prefill and decode, exposed TP communication, FLOPs and bytes sent per GPU."""

    prefill_s: float
    decode_s: float
    communication_s: float
    flops: float
    communication_bytes: float


def _kv_bytes_per_token(spec: ModelSpec, workload: Workload, context: float) -> float:
    """KV-cache bytes of one sequence at ``context`` tokens, all layers."""
    wide = 4 if workload.precision is Precision.FP32 else 2
    element = 1 if workload.kv_dtype is KvDtype.FP8 else wide
    att = spec.attn
    per_token = (att.mla.kv_lora_rank + att.mla.qk_rope_head_dim) if att.mla else 2 * att.num_kv_heads * att.head_dim
    limits = [layer_kv_limit(layer) for layer in spec.layers if layer.attends]
    held = sum(min(context, limit) if limit else context for limit in limits)
    return per_token * element * held


def inference_parts(spec: ModelSpec, workload: Workload, gpu: GpuSpec, peak: float) -> InferenceParts:
    """Prefill + decode seconds of one batch of ``batch`` sequences on one GPU (see module doc)."""
    par = workload.parallel
    generate = workload.generate
    prompt = max(workload.total_context - generate, 1)
    batch, tp = workload.batch, par.tp
    per_token = 2.0 * (layer_matmul_parameters(spec) + spec.vocab_size * spec.hidden_size)
    prefill_tokens = batch * prompt
    prefill_flops = prefill_tokens * (per_token + attention_core_flops(spec, prompt))
    rate = peak * MFU
    per_gpu_tokens = prefill_tokens / tp
    prefill_s = prefill_flops / tp / (rate * per_gpu_tokens / (per_gpu_tokens + SATURATION_TOKENS))
    mean_context = prompt + generate / 2
    step_flops = batch * (per_token + 2.0 * attention_core_flops(spec, int(mean_context)))
    weight_bytes = spec.num_parameters * _WEIGHT_BYTES.get(
        workload.quant, 4.0 if workload.precision is Precision.FP32 else 2.0
    )
    step_bytes = (weight_bytes + batch * _kv_bytes_per_token(spec, workload, mean_context)) / tp
    bandwidth = float(gpu.memory_bandwidth_bytes_per_s or 0) * MEMORY_EFFICIENCY
    decode_s = generate * max(step_bytes / bandwidth, step_flops / tp / rate)
    volume = 0.0
    if tp > 1:
        wire = 4 if workload.precision is Precision.FP32 else 2
        activation = spec.hidden_size * wire * spec.num_layers * 2 * 2 * (tp - 1) / tp
        volume = activation * (prefill_tokens + batch * generate)
    comm_s = volume / (intra_bandwidth(gpu) if tp <= GPUS_PER_NODE else inter_bandwidth(gpu))
    return InferenceParts(
        prefill_s=prefill_s,
        decode_s=decode_s,
        communication_s=comm_s,
        flops=prefill_flops + generate * step_flops,
        communication_bytes=volume,
    )
