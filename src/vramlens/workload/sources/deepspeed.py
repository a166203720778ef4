"""DeepSpeed JSON (``ds_config.json``) -> workload.

Semantics from DeepSpeed's own code (``deepspeed/runtime/zero/config.py``, ``stage_1_and_2.py``,
``stage3.py``): ``zero_optimization.stage`` 1/2/3 partitions optimizer states / + gradients /
+ parameters; ``offload_optimizer.device: cpu|nvme`` keeps the fp32 master weights, the states
and the gradient partitions in CPU memory (the optimizer's ``self.device`` is the CPU) and runs
DeepSpeedCPUAdam; ``offload_param`` (stage 3) keeps the bf16 parameter partitions there too.
``bf16.enabled`` / ``fp16.enabled`` give bf16/fp16 parameters with fp32 master weights inside the
optimizer. ``"auto"`` values are filled by the HF Trainer from its own arguments, so they are
left to the flags (or the outer config that named this file). The model is never in a DeepSpeed
config: give it as MODEL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from vramlens.workload.sources._common import list_leftovers
from vramlens.workload.sources._mapping import MappingBuilder, SourcedWorkload
from vramlens.workload.sources._text import as_int, truthy
from vramlens.workload.sources._text import or_empty as _or_empty
from vramlens.workload.sources.shared import ReadContext

__all__ = ["detect", "read"]

NAME: Final = "deepspeed"

_TOP_USED: Final = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "bf16",
    "fp16", "zero_optimization", "activation_checkpointing",
})  # fmt: skip
_TOP_IGNORED: Final = frozenset({
    "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer",
    "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comms_logger", "prescale_gradients",
    "gradient_predivide_factor", "zero_force_ds_cpu_optimizer", "dump_state", "memory_breakdown", "checkpoint",
    "aio", "elasticity", "autotuning", "monitor_config", "steps_per_print_interval", "sparse_gradients",
    "disable_allgather", "timers", "seed",
})  # fmt: skip
#: DeepSpeed's ZeRO sizes the estimator models, each a ``parallel`` key of the same name ("auto": HF Trainer's fill).
_ZERO_SIZES: Final = (
    "reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_param_persistence_threshold", "sub_group_size",
)  # fmt: skip
_ZERO_USED: Final = frozenset(
    {"stage", "offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_params", *_ZERO_SIZES}
)
_ZERO_IGNORED: Final = frozenset({
    "contiguous_gradients", "overlap_comm", "reduce_scatter", "allgather_partitions", "round_robin_gradients",
    "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save", "elastic_checkpoint",
    "ignore_unused_parameters", "load_from_fp32_weights", "legacy_stage1", "use_multi_rank_bucket_allreduce",
    "cpu_offload_use_pin_memory", "log_trace_cache_warnings",
})  # fmt: skip
_OPTIMIZERS: Final = {
    "adam": "adamw", "adamw": "adamw", "fusedadam": "adamw", "cpuadam": "adamw", "deepspeedcpuadam": "adamw",
    "lion": "lion", "fusedlion": "lion", "cpulion": "lion",
}  # fmt: skip


def detect(data: Any) -> bool:
    """A DeepSpeed config has a ``zero_optimization`` block or its batch keys."""
    return isinstance(data, Mapping) and any(
        key in data for key in ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size")
    )


def _auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def read(data: Mapping[str, Any], ctx: ReadContext) -> SourcedWorkload:
    out = MappingBuilder(NAME)
    out.fixed("mode", "train", "a training config")
    out.fixed("framework", "deepspeed", "bf16/fp16 params and grads, fp32 master in the optimizer")
    gpus = _batch(out, data)
    _precision(out, data)
    zero = _or_empty(data.get("zero_optimization"))
    if not isinstance(zero, Mapping):
        raise out.fail("zero_optimization", f"expected a mapping, got {type(zero).__name__}")
    _zero(out, zero, gpus)
    _optimizer(out, data.get("optimizer"))
    _checkpointing(out, data.get("activation_checkpointing"))
    list_leftovers(out, data, used=_TOP_USED, ignore=lambda key: key in _TOP_IGNORED)
    list_leftovers(out, zero, used=_ZERO_USED, ignore=lambda key: key in _ZERO_IGNORED or _auto(zero.get(key)),
                   prefix="zero_optimization.")  # fmt: skip
    return out.result(ctx.origin)


def _batch(out: MappingBuilder, data: Mapping[str, Any]) -> int | None:
    """Micro-batch, accumulation and, from ``train_batch_size``, the GPU count (None when unknown)."""
    values: dict[str, int | None] = {}
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        raw = data.get(key)
        if raw is None or _auto(raw):
            values[key] = None
            if raw is not None:
                out.note(f"{key} auto: filled by the HF Trainer from its arguments; left to the flags")
            continue
        values[key] = as_int(f"{NAME} {key}", raw)
        if values[key] is not None and values[key] < 1:  # type: ignore[operator]
            raise out.fail(key, f"must be an integer >= 1, got {raw!r}")
    micro, accum, total = (
        values[k] for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
    )
    if micro is not None:
        out.set("batch", micro, "train_micro_batch_size_per_gpu")
    if accum is not None:
        out.set("grad_accum", accum, "gradient_accumulation_steps")
    if total is None or micro is None:
        return None
    per_gpu = micro * (accum or 1)
    if total % per_gpu:
        raise out.fail("train_batch_size", f"{total} is not train_micro_batch_size_per_gpu x gradient_accumulation_steps "
                       f"({micro} x {accum or 1}) x GPUs")  # fmt: skip
    gpus = total // per_gpu
    out.set("parallel.gpus", gpus, "train_batch_size", shown=total, why=f"{total} / ({micro} x {accum or 1})")
    return gpus


def _precision(out: MappingBuilder, data: Mapping[str, Any]) -> None:
    def enabled(block: Any) -> bool | None:
        if not isinstance(block, Mapping) or "enabled" not in block:
            return False if block is None else None
        return None if _auto(block["enabled"]) else truthy(block["enabled"])

    bf16, fp16 = enabled(data.get("bf16")), enabled(data.get("fp16"))
    if bf16:
        out.set(
            "precision",
            "mixed-bf16",
            "bf16.enabled",
            shown=True,
            why="bf16 weights, fp32 master weights in the optimizer",
        )
    elif fp16:
        out.set(
            "precision",
            "mixed-fp16",
            "fp16.enabled",
            shown=True,
            why="fp16 weights, fp32 master weights in the optimizer",
        )
    elif bf16 is None or fp16 is None:
        out.note("bf16/fp16 enabled auto: the Trainer's --bf16/--fp16 decide; precision left to the flags", "precision")
    else:
        out.set("precision", "fp32", "bf16.enabled", shown=False, why="neither bf16 nor fp16 enabled")


def _device(block: Any) -> str:
    if isinstance(block, Mapping):
        return str(block.get("device") or "none").strip().lower()
    return "none"


def _zero(out: MappingBuilder, zero: Mapping[str, Any], gpus: int | None) -> None:
    raw = zero.get("stage", 0)
    stage = as_int(f"{NAME} zero_optimization.stage", raw)
    if stage not in (0, 1, 2, 3):
        raise out.fail("zero_optimization.stage", f"must be 0, 1, 2 or 3, got {raw!r}")
    shard = ("ddp" if gpus != 1 else "none", "zero1", "zero2", "zero3")[stage]
    out.set("parallel.shard", shard, "zero_optimization.stage", shown=raw)
    optimizer = _device(zero.get("offload_optimizer"))
    params = _device(zero.get("offload_param"))
    if truthy(zero.get("cpu_offload")):
        optimizer = "cpu"
    if truthy(zero.get("cpu_offload_params")):
        params = "cpu"
    for key, device in (("offload_optimizer", optimizer), ("offload_param", params)):
        if device not in ("none", "cpu", "nvme"):
            raise out.fail(f"zero_optimization.{key}.device", f"unknown device {device!r}; expected none, cpu or nvme")
    if params != "none" and stage < 3:
        out.note(f"offload_param is used by ZeRO stage 3 only; ignored at stage {stage}")
        params = "none"
    _sizes(out, zero, stage)
    if params != "none" and optimizer == "none":
        out.not_modelled("zero_optimization.offload_param", params, "parameters offloaded without the optimizer")
    elif optimizer != "none":
        value = "optimizer+params" if params != "none" else "optimizer"
        why = "NVMe offload: nothing of it stays on the GPU, as with the CPU" if "nvme" in (optimizer, params) else ""
        out.set("parallel.offload", value, "zero_optimization.offload_*", shown=f"{optimizer}/{params}", why=why)


def _sizes(out: MappingBuilder, zero: Mapping[str, Any], stage: int) -> None:
    """The ZeRO sizes the estimator reads (elements; ``1e9`` style numbers accepted); ``"auto"`` and
    the stage-3 ones at another stage are left to the defaults (:mod:`vramlens.resolve.zero`)."""
    for key in _ZERO_SIZES:
        raw = zero.get(key)
        if raw is None or _auto(raw):
            continue
        stage3 = key != "reduce_bucket_size"
        if (stage3 and stage != 3) or stage == 0:
            out.note(f"zero_optimization.{key} is read at ZeRO stage {'3' if stage3 else '1-3'} "
                     f"only; ignored at stage {stage}")  # fmt: skip
            continue
        out.set(
            f"parallel.{key}", as_int(f"{NAME} zero_optimization.{key}", raw), f"zero_optimization.{key}", shown=raw
        )


def _optimizer(out: MappingBuilder, block: Any) -> None:
    if block is None:
        out.note("no optimizer block: the client's optimizer (the Trainer's --optim) is used", "optimizer")
        return
    kind = str(block.get("type", "")) if isinstance(block, Mapping) else str(block)
    name = _OPTIMIZERS.get(kind.strip().lower().replace("_", ""))
    if name is None:
        out.not_modelled("optimizer.type", kind, "no memory model; the default adamw stands in")
        return
    out.set("optimizer", name, "optimizer.type", shown=kind)
    out.set(
        "optimizer_impl",
        "fused",
        "optimizer.type",
        shown=kind,
        why="DeepSpeed's FusedAdam/CPU-Adam: no step temporaries",
    )


def _checkpointing(out: MappingBuilder, block: Any) -> None:
    if not isinstance(block, Mapping):
        return
    if truthy(block.get("cpu_checkpointing")):
        out.set("recompute", "offload", "activation_checkpointing.cpu_checkpointing", shown=True,
                why="applies to models that call deepspeed.checkpointing (Megatron-DeepSpeed)")  # fmt: skip
    else:
        out.note("activation_checkpointing: configures deepspeed.checkpointing for models that call it; "
                 "HF models checkpoint with the Trainer's --gradient_checkpointing (--recompute full)")  # fmt: skip
    if truthy(block.get("partition_activations")):
        out.not_modelled(
            "activation_checkpointing.partition_activations", True, "checkpoints split over model-parallel ranks"
        )
