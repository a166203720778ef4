"""DeepSpeed ZeRO's gradient buffers, and the gradients that leave the GPU with an offloaded optimizer.

With ``offload: optimizer`` or ``optimizer+params`` the optimizer steps on the CPU, and the
gradient partitions it steps on live in CPU memory too - they are not kept on the GPU:

* **DeepSpeed ZeRO-3** (``deepspeed/runtime/zero/stage3.py``): the optimizer's ``self.device``
  is the CPU when ``offload_optimizer`` is set, and ``grad_partitions_flat_buffer`` - every
  rank's gradient partition - is allocated on that device (pinned). ``partition_grads`` copies
  each reduced partition into it and frees ``param.grad``. What stays on the GPU is the
  contiguous reduce ("IPG") bucket, ``torch.empty(reduce_bucket_size)`` per communication dtype,
  plus the gradients of the layer being reduced (counted with the unsharded layer, fsdp.py).
* **DeepSpeed ZeRO-1/2** (``stage_1_and_2.py``): with ``cpu_offload`` the averaged gradient
  partitions are accumulated in CPU memory; the GPU keeps the IPG bucket (two buffers of
  ``reduce_bucket_size`` with ``overlap_comm``, which the HF DeepSpeed examples turn on) and
  ``temp_grad_buffer_for_gpu_offload`` (the largest parameter's element count).
* **FSDP** ``CPUOffload(offload_params=True)`` / FSDP2 ``CPUOffloadPolicy`` (``optimizer+params``):
  sharded gradients are moved to the CPU after the reduce-scatter; only the unsharded layer
  gradients in flight (fsdp.py) are on the GPU. FSDP has no optimizer-only offload, so with
  ``offload: optimizer`` its gradients stay sharded on the GPU.

The reduce bucket is allocated whether or not the optimizer is offloaded (``contiguous_gradients``,
DeepSpeed's default): ZeRO-3 ``bucket.buffer = torch.empty(reduce_bucket_size)``, ZeRO-1/2
``setup_buckets``. ``reduce_bucket_size``: the workload's ``parallel.reduce_bucket_size``, else what the HF
Trainer fills DeepSpeed's ``"auto"`` with, ``hidden_size**2`` (``transformers/integrations/deepspeed.py``);
DeepSpeed's own default is ``5e8`` elements (``zero/config.py``; :mod:`vramlens.resolve.zero`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vramlens.estimator.layout import StageView
from vramlens.model.modules import all_layer_linears
from vramlens.resolve.context import TrainingContext
from vramlens.workload.options import Offload, Shard

__all__ = ["GradientBuffers", "gradient_buffers", "reduce_bucket_elements"]

#: IPG buffers of ZeRO-1/2 with ``overlap_comm: true`` (double buffering); ZeRO-3 keeps one per dtype.
ZERO12_BUCKETS = 2
ZERO3_BUCKETS = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class GradientBuffers:
    """DeepSpeed's gradient buffers on the GPU and whether the gradient partitions left it."""

    partitions_on_cpu: bool
    """The sharded gradients live in CPU memory (with the offloaded optimizer)."""
    buffer_bytes: int
    """Reduce buckets (and, offloaded ZeRO-1/2, the staging buffer of the largest parameter)."""
    formula: Callable[[], str]


def reduce_bucket_elements(ctx: TrainingContext) -> int:
    """``reduce_bucket_size`` in elements: the workload's, else as the HF Trainer fills DeepSpeed's
    ``auto``, ``hidden_size**2`` (:mod:`vramlens.resolve.zero`)."""
    if ctx.zero is not None:
        return ctx.zero.reduce_bucket
    return ctx.spec.hidden_size * ctx.spec.hidden_size


def _largest_trainable(ctx: TrainingContext, stage: StageView) -> int:
    """Elements of the largest trainable tensor (a LoRA adapter matrix is rank x its larger side)."""
    largest = 0
    for group in stage.trainable:
        if group.largest_tensor:
            largest = max(largest, group.largest_tensor)
        elif group.name.startswith("LoRA"):
            side = max((max(s.in_features, s.out_features) for s in all_layer_linears(ctx.spec)), default=0)
            largest = max(largest, min(group.elements, ctx.workload.lora.rank * side))
        else:
            largest = max(largest, group.elements)
    return largest


def gradient_buffers(ctx: TrainingContext, stage: StageView) -> GradientBuffers | None:
    """DeepSpeed ZeRO's gradient buffers (``shard: zero1-3``) and FSDP's CPU offload of gradients
    (``optimizer+params``); None for everything else (gradients as the sharding puts them)."""
    parallel = ctx.workload.parallel
    offloaded = parallel.offload is not Offload.NONE
    if parallel.shard in (Shard.FSDP, Shard.HSDP):
        if parallel.offload is not Offload.OPTIMIZER_PARAMS:
            return None  # FSDP has no optimizer-only offload of its own: gradients stay sharded on the GPU
        return GradientBuffers(partitions_on_cpu=True, buffer_bytes=0,
                               formula=lambda: "FSDP CPU offload: sharded gradients in CPU memory")  # fmt: skip
    if parallel.shard not in (Shard.ZERO1, Shard.ZERO2, Shard.ZERO3):
        return None
    size, bucket = ctx.grad_bytes, reduce_bucket_elements(ctx)
    buckets = ZERO3_BUCKETS if parallel.shard is Shard.ZERO3 else ZERO12_BUCKETS
    staging = _largest_trainable(ctx, stage) if offloaded and parallel.shard is not Shard.ZERO3 else 0
    total = (buckets * bucket + staging) * size
    where = "gradient partitions in CPU memory (offloaded optimizer); " if offloaded else ""
    extra = f" + the largest parameter {staging:,} (CPU-offload staging buffer)" if staging else ""
    return GradientBuffers(
        partitions_on_cpu=offloaded,
        buffer_bytes=total,
        formula=lambda: (
            f"{where}{buckets} reduce bucket(s) of reduce_bucket_size {bucket:,}{extra} elements x {size} B"
        ),
    )
