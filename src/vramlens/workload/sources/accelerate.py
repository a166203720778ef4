"""accelerate config YAML (``accelerate config`` / ``--config_file``) -> workload.

Follows accelerate's ``ClusterConfig``: ``distributed_type`` NO / MULTI_GPU (DDP) / FSDP /
DEEPSPEED; ``num_processes`` is the total over all machines; ``mixed_precision`` no / fp16 /
bf16 / fp8 is autocast over the model's own (fp32) weights; ``fsdp_config`` as in
:func:`~vramlens.workload.sources.shared.map_fsdp_words` (``fsdp_version`` 1 keeps the root
unit gathered, 2 wraps embedding and head on their own); ``deepspeed_config`` with
``zero_stage`` and ``offload_optimizer_device`` / ``offload_param_device``, or a
``deepspeed_config_file`` beside this one. The model and the batch are the script's, not the
config's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from vramlens.workload.sources._common import list_leftovers
from vramlens.workload.sources._mapping import MappingBuilder, SourcedWorkload
from vramlens.workload.sources._text import as_int, truthy
from vramlens.workload.sources._text import or_empty as _or_empty
from vramlens.workload.sources.shared import ReadContext, map_fsdp_words, merge_deepspeed

__all__ = ["detect", "read"]

NAME: Final = "accelerate"

_USED: Final = frozenset({
    "distributed_type", "num_processes", "num_machines", "mixed_precision", "fsdp_config", "deepspeed_config",
    "dynamo_config", "use_cpu", "megatron_lm_config",
})  # fmt: skip
_IGNORED: Final = frozenset({
    "compute_environment", "debug", "downcast_bf16", "machine_rank", "main_training_function", "rdzv_backend",
    "same_network", "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "main_process_ip", "main_process_port", "gpu_ids",
    "enable_cpu_affinity", "ipex_config", "mpirun_config", "commands", "command_file", "tpu_name", "tpu_zone",
    "dynamo_backend", "fp8_config", "parallelism_config",
})  # fmt: skip
_PRECISION: Final = {"no": "fp32", "fp16": "mixed-fp16", "bf16": "mixed-bf16", "fp8": "mixed-bf16"}


def detect(data: Any) -> bool:
    """accelerate configs say ``distributed_type`` (and usually ``compute_environment``)."""
    return isinstance(data, Mapping) and ("distributed_type" in data or "compute_environment" in data)


def read(data: Mapping[str, Any], ctx: ReadContext) -> SourcedWorkload:
    out = MappingBuilder(NAME)
    out.fixed("mode", "train", "a training launcher config")
    if truthy(data.get("use_cpu")):
        raise out.fail("use_cpu", "this config runs on the CPU; vramlens estimates GPU memory")
    kind = str(data.get("distributed_type", "NO")).strip().upper()
    processes = _processes(out, data)
    _precision(out, data)
    if kind == "MULTI_GPU":
        out.set("parallel.shard", "ddp", "distributed_type", shown=kind, why="DistributedDataParallel")
    elif kind == "FSDP":
        _fsdp(out, data, processes)
    elif kind == "DEEPSPEED":
        _deepspeed(out, data, ctx)
    elif kind not in ("NO", "MULTI_CPU"):
        out.not_modelled("distributed_type", kind)
    dynamo = data.get("dynamo_config")
    backend = dynamo.get("dynamo_backend") if isinstance(dynamo, Mapping) else data.get("dynamo_backend")
    if backend is not None and str(backend).strip().upper() not in ("NO", "NONE", ""):
        out.set("compile", True, "dynamo_backend", shown=backend)
    out.note("the model, micro-batch and sequence length are the training script's: give them as MODEL and flags")
    list_leftovers(out, data, used=_USED, ignore=lambda key: key in _IGNORED)
    return out.result(ctx.origin)


def _processes(out: MappingBuilder, data: Mapping[str, Any]) -> int:
    raw = data.get("num_processes", 1)
    processes = as_int(f"{NAME} num_processes", raw)
    if processes < 1:
        raise out.fail("num_processes", f"must be an integer >= 1, got {raw!r}")
    out.set("parallel.gpus", processes, "num_processes", why="one process per GPU, over all machines")
    return processes


def _precision(out: MappingBuilder, data: Mapping[str, Any]) -> None:
    raw = data.get("mixed_precision", "no")
    text = str(raw).strip().lower()
    if text not in _PRECISION:
        raise out.fail("mixed_precision", f"unknown value {raw!r}; expected no, fp16, bf16 or fp8")
    out.set("precision", _PRECISION[text], "mixed_precision", shown=raw, why="autocast over fp32 weights")
    if text == "fp8":
        out.set("float8", True, "mixed_precision", shown=raw, why="fp8 matmuls, bf16 autocast elsewhere")


def _fsdp(out: MappingBuilder, data: Mapping[str, Any], processes: int) -> None:
    config = _or_empty(data.get("fsdp_config"))
    if not isinstance(config, Mapping):
        raise out.fail("fsdp_config", f"expected a mapping, got {type(config).__name__}")
    map_fsdp_words(out, "fsdp_config", [], config)
    machines = as_int(f"{NAME} num_machines", data.get("num_machines", 1))
    keys = out.keys.get("parallel", {})
    if keys.get("shard") == "hsdp" and machines >= 1 and processes % machines == 0:
        out.set("parallel.shard_degree", processes // machines, "num_machines", shown=machines,
                why="hybrid sharding: one shard group per machine")  # fmt: skip


def _deepspeed(out: MappingBuilder, data: Mapping[str, Any], ctx: ReadContext) -> None:
    config = _or_empty(data.get("deepspeed_config"))
    if not isinstance(config, Mapping):
        raise out.fail("deepspeed_config", f"expected a mapping, got {type(config).__name__}")
    out.set("framework", "deepspeed", "distributed_type", shown="DEEPSPEED")
    if config.get("deepspeed_config_file"):
        merge_deepspeed(out, "deepspeed_config.deepspeed_config_file", config["deepspeed_config_file"], ctx)
        return
    raw = config.get("zero_stage", 2)
    stage = as_int(f"{NAME} deepspeed_config.zero_stage", raw)
    if stage not in (0, 1, 2, 3):
        raise out.fail("deepspeed_config.zero_stage", f"must be 0, 1, 2 or 3, got {raw!r}")
    out.set("parallel.shard", ("ddp", "zero1", "zero2", "zero3")[stage], "deepspeed_config.zero_stage", shown=raw)
    optimizer = str(config.get("offload_optimizer_device") or "none").lower()
    params = str(config.get("offload_param_device") or "none").lower()
    if optimizer != "none":
        value = "optimizer+params" if params != "none" and stage == 3 else "optimizer"
        out.set("parallel.offload", value, "deepspeed_config.offload_*_device", shown=f"{optimizer}/{params}")
    elif params != "none":
        out.not_modelled("deepspeed_config.offload_param_device", params, "parameters offloaded without the optimizer")
    if config.get("gradient_accumulation_steps") not in (None, "auto"):
        out.set("grad_accum", config["gradient_accumulation_steps"], "deepspeed_config.gradient_accumulation_steps")
