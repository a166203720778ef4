"""Communication and offload traffic of one optimizer step, per GPU, and the part left exposed.

Volumes are bytes one GPU sends with ring collectives (Patarasuk & Yuan 2009; NCCL):
an all-reduce of ``X`` bytes over ``n`` ranks sends ``2X(n-1)/n``, an all-gather or a
reduce-scatter ``X(n-1)/n``. Per step:

* DDP: one gradient all-reduce, ``2G(n-1)/n``; ZeRO-1/2: reduce-scatter + all-gather, the same.
* ZeRO-3/FSDP: parameter all-gathers in forward and in backward of every micro-batch
  (``2P(n-1)/n`` each) plus one gradient reduce-scatter (``G(n-1)/n``): ``1.5x`` DDP at
  ``grad_accum = 1``. HSDP: that within the shard group, plus an all-reduce of the
  ``G/shard`` gradient shard across replicas.
* TP (Megatron, with or without sequence parallelism): 4 all-reduces (or all-gather +
  reduce-scatter pairs) of ``b x s x h`` activations per layer per micro-batch.
* PP: each stage boundary sends activations forward and gradients backward per micro-batch.
* CP (ring attention): each layer passes K/V around the ring, ``cp-1`` hops forward, twice
  that (K/V and their gradients) backward. EP: 4 all-to-alls of the routed tokens per MoE layer.

Gradients and parameters travel in the compute dtype (2 bytes; 4 for fp32), as DeepSpeed,
Megatron and FSDP ``MixedPrecision(reduce_dtype=param_dtype)`` do. Links: NVLink (half the
table's bidirectional figure per direction) or PCIe within a node of up to 8 GPUs, the
inter-node network beyond (:data:`~vramlens.estimator.time_tables.INTER_NODE_BYTES_PER_S`).
Overlap with compute per kind: :data:`~vramlens.estimator.time_tables.OVERLAP`; never more
than the compute time is hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.estimator.time_flops import trainable_parameters
from vramlens.estimator.time_tables import (
    CPU_ADAM_PARAMS_PER_S,
    GPUS_PER_NODE,
    INTER_NODE_BYTES_PER_S,
    LINK_EFFICIENCY,
    OVERLAP,
    PCIE_BYTES_PER_S,
)
from vramlens.hardware import GpuSpec
from vramlens.model.spec import ModelSpec
from vramlens.resolve.derived import seq_per_rank
from vramlens.workload.options import Offload, Precision, Recompute, Shard
from vramlens.workload.spec import Workload

__all__ = ["Traffic", "communication", "inter_bandwidth", "intra_bandwidth", "offload_traffic", "pcie_bandwidth"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Traffic:
    """Bytes one GPU moves in a step, the seconds left exposed, and CPU work (offload)."""

    bytes: float = 0.0
    exposed_s: float = 0.0
    cpu_seconds: float = 0.0
    notes: tuple[str, ...] = ()


def _wire_bytes(workload: Workload) -> int:
    return 4 if workload.precision is Precision.FP32 else 2


def intra_bandwidth(gpu: GpuSpec) -> float:
    """Achieved bytes/s per direction between GPUs of a node: NVLink, else PCIe."""
    if gpu.nvlink_bytes_per_s:
        return gpu.nvlink_bytes_per_s / 2 * LINK_EFFICIENCY
    return pcie_bandwidth(gpu)


def inter_bandwidth(gpu: GpuSpec) -> float:
    """Achieved bytes/s per direction per GPU over the inter-node network."""
    per_gpu = INTER_NODE_BYTES_PER_S.get(gpu.architecture or "", INTER_NODE_BYTES_PER_S["default"])
    return per_gpu * LINK_EFFICIENCY


def pcie_bandwidth(gpu: GpuSpec) -> float:
    """Host link bytes/s per direction, achieved (PCIe generation from the table; gen4 if unknown)."""
    text = (gpu.pcie or "").lower()
    if "c2c" in text and gpu.nvlink_bytes_per_s:
        return gpu.nvlink_bytes_per_s / 2 * LINK_EFFICIENCY
    generation = next((key for key in PCIE_BYTES_PER_S if key in text), "gen4")
    return PCIE_BYTES_PER_S[generation] * LINK_EFFICIENCY


def _exposed(seconds: float, kind: str, compute_s: float) -> float:
    return max(seconds * (1.0 - OVERLAP[kind]), seconds - compute_s)


def _ring(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def _data_parallel(spec: ModelSpec, workload: Workload, gpu: GpuSpec) -> tuple[float, float, float]:
    """(bytes, gradient seconds, parameter-gather seconds) of DP/ZeRO/FSDP traffic."""
    par, wire = workload.parallel, _wire_bytes(workload)
    ranks = par.dp * par.cp
    if par.shard is Shard.NONE or ranks == 1:
        return 0.0, 0.0, 0.0
    model_parallel = par.tp * par.pp
    grads = trainable_parameters(spec, workload) / model_parallel * wire
    params = spec.num_parameters / model_parallel * wire
    multi_node = par.gpus > GPUS_PER_NODE
    outer = inter_bandwidth(gpu) if multi_node else intra_bandwidth(gpu)
    if par.shard in (Shard.DDP, Shard.ZERO1, Shard.ZERO2):
        volume = 2 * grads * _ring(ranks)
        return volume, volume / outer, 0.0
    shard = par.shard_group
    inner = intra_bandwidth(gpu) if shard * model_parallel <= GPUS_PER_NODE else outer
    gathers = 2 * params * _ring(shard) * workload.grad_accum
    reduce = grads * _ring(shard)
    replicas = ranks // shard
    across = 2 * grads / shard * _ring(replicas)
    grad_s = reduce / inner + across / outer
    return gathers + reduce + across, grad_s, gathers / inner


def _activation_bytes(spec: ModelSpec, workload: Workload) -> float:
    """Bytes of one ``b x s x h`` activation on one rank (sequence split by cp)."""
    return workload.batch * seq_per_rank(workload) * spec.hidden_size * _wire_bytes(workload)


def _model_parallel(spec: ModelSpec, workload: Workload, gpu: GpuSpec) -> dict[str, tuple[float, float]]:
    """``kind -> (bytes, seconds)`` of TP, PP, CP and EP traffic for the whole step."""
    par, steps = workload.parallel, workload.grad_accum
    activation = _activation_bytes(spec, workload)
    layers = spec.num_layers / par.pp
    multi_node = par.gpus > GPUS_PER_NODE
    intra = intra_bandwidth(gpu)
    outer = inter_bandwidth(gpu) if multi_node else intra
    out: dict[str, tuple[float, float]] = {}
    if par.tp > 1:
        volume = 4 * 2 * activation * _ring(par.tp) * layers * steps
        out["tp"] = (volume, volume / (intra if par.tp <= GPUS_PER_NODE else outer))
    if par.pp > 1:
        volume = 2 * activation / par.tp * steps
        out["pp"] = (volume, volume / outer)
    if par.cp > 1:
        att = spec.attn
        kv = activation / spec.hidden_size * 2 * att.num_kv_heads * att.head_dim / par.tp
        volume = 3 * (par.cp - 1) * kv * layers * steps
        out["cp"] = (volume, volume / intra)
    if par.ep > 1 and spec.moe is not None:
        routed = activation * spec.moe.experts_per_token
        volume = 4 * routed * _ring(par.ep) * spec.num_moe_layers / par.pp * steps
        out["ep"] = (volume, volume / outer)
    return out


def communication(spec: ModelSpec, workload: Workload, gpu: GpuSpec, compute_s: float) -> Traffic:
    """NVLink/network traffic of one step and its exposed seconds (see module doc)."""
    volume, grad_s, param_s = _data_parallel(spec, workload, gpu)
    exposed = _exposed(grad_s, "dp", compute_s) + _exposed(param_s, "params", compute_s)
    for kind, (kind_bytes, seconds) in _model_parallel(spec, workload, gpu).items():
        volume += kind_bytes
        exposed += _exposed(seconds, kind, compute_s)
    notes: tuple[str, ...] = ()
    if workload.parallel.tp > 1 and workload.recompute is not Recompute.NONE:
        notes = ("time: TP all-reduces repeated by recompute are not counted",)
    return Traffic(bytes=volume, exposed_s=exposed, notes=notes)


def offload_traffic(spec: ModelSpec, workload: Workload, gpu: GpuSpec, compute_s: float) -> Traffic:
    """PCIe traffic of offloaded optimizer state/parameters/activations, and the CPU optimizer step."""
    par, wire = workload.parallel, _wire_bytes(workload)
    model_parallel = par.tp * par.pp
    volume, cpu_s, notes = 0.0, 0.0, []
    if par.offload is not Offload.NONE:
        shard = trainable_parameters(spec, workload) / (model_parallel * par.shard_group)
        volume += 2 * shard * wire
        cpu_s = shard * min(par.gpus, GPUS_PER_NODE) / CPU_ADAM_PARAMS_PER_S
        notes.append("time: offloaded optimizer steps on the CPU (ZeRO-Offload CPU-Adam throughput), not overlapped")
    if par.offload is Offload.OPTIMIZER_PARAMS:
        params = spec.num_parameters / (model_parallel * par.shard_group)
        volume += 2 * params * wire * workload.grad_accum
    if workload.recompute is Recompute.OFFLOAD:
        layer_input = _activation_bytes(spec, workload) / par.tp
        volume += 2 * layer_input * spec.num_layers / par.pp * workload.grad_accum
    if volume == 0.0:
        return Traffic()
    seconds = volume / pcie_bandwidth(gpu)
    return Traffic(bytes=volume, exposed_s=_exposed(seconds, "pcie", compute_s), cpu_seconds=cpu_s, notes=tuple(notes))
