"""torchtune recipe YAML (``tune run <recipe> --config file.yaml``) -> workload.

Read as torchtune's recipes read it (``recipes/full_finetune_*.py``, ``lora_finetune_*.py``):
``model._component_`` names a builder (``torchtune.models.llama3_1.lora_llama3_1_8b``; ``lora_``
/ ``qlora_`` prefixes choose the method, QLoRA's base is NF4 (torchao ``NF4Tensor``, block
64 with double-quantized scales)); ``lora_attn_modules`` (q_proj, k_proj, v_proj, output_proj),
``apply_lora_to_mlp`` (w1, w2, w3), ``apply_lora_to_output``; ``dtype`` is the dtype of
weights, gradients and optimizer states (no autocast: bf16 is pure bf16; ``training.get_dtype``
gives fp32 when unset); ``enable_activation_checkpointing`` wraps every layer,
``enable_activation_offloading`` moves what checkpointing keeps to the CPU; ``loss`` chunked
(``CEWithChunkedOutputLoss``); ``optimizer_in_bwd``; ``compile``; ``batch_size``,
``gradient_accumulation_steps``, ``tokenizer.max_seq_len``, ``dataset.packed``; FSDP keys of the
distributed recipes (``fsdp_cpu_offload``, ``fsdp_reshard_after_forward``, ``tensor_parallel_dim``).
The process count is ``tune run --nproc_per_node``'s, not the config's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from vramlens.workload.sources._common import COMMON_IGNORED_PREFIXES, ignored, list_leftovers
from vramlens.workload.sources._mapping import MappingBuilder, SourcedWorkload, short
from vramlens.workload.sources._text import truthy
from vramlens.workload.sources.shared import ReadContext

__all__ = ["BUILDERS", "detect", "read"]

NAME: Final = "torchtune"

#: torchtune model builders (without the lora_/qlora_ prefix) -> vramlens catalog names.
BUILDERS: Final[dict[str, str]] = {
    "llama2_7b": "llama-2-7b", "llama2_13b": "llama-2-13b", "llama2_70b": "llama-2-70b",
    "llama3_8b": "llama-3-8b", "llama3_70b": "llama-3-70b",
    "llama3_1_8b": "llama-3.1-8b", "llama3_1_70b": "llama-3.1-70b", "llama3_1_405b": "llama-3.1-405b",
    "llama3_2_1b": "llama-3.2-1b", "llama3_2_3b": "llama-3.2-3b", "llama3_3_70b": "llama-3.3-70b",
    "mistral_7b": "mistral-7b", "gemma_2b": "gemma-2b", "gemma2_2b": "gemma-2-2b", "gemma2_27b": "gemma-2-27b",
    "phi3_mini": "phi-3-mini", "phi4_14b": "phi-4",
    "qwen2_5_0_5b": "qwen2.5-0.5b", "qwen2_5_1_5b_base": "qwen2.5-1.5b", "qwen2_5_1_5b_instruct": "qwen2.5-1.5b",
    "qwen2_5_3b": "qwen2.5-3b", "qwen2_5_7b_base": "qwen2.5-7b", "qwen2_5_7b_instruct": "qwen2.5-7b",
    "qwen2_5_14b_base": "qwen2.5-14b", "qwen2_5_14b_instruct": "qwen2.5-14b",
    "qwen2_5_32b_base": "qwen2.5-32b", "qwen2_5_32b_instruct": "qwen2.5-32b", "qwen2_5_72b_instruct": "qwen2.5-72b-instruct",
    "qwen3_0_6b_base": "qwen3-0.6b", "qwen3_0_6b_instruct": "qwen3-0.6b", "qwen3_1_7b_base": "qwen3-1.7b",
    "qwen3_1_7b_instruct": "qwen3-1.7b", "qwen3_4b_base": "qwen3-4b", "qwen3_4b_instruct": "qwen3-4b",
    "qwen3_8b_base": "qwen3-8b", "qwen3_8b_instruct": "qwen3-8b", "qwen3_14b_base": "qwen3-14b",
    "qwen3_14b_instruct": "qwen3-14b", "qwen3_32b": "qwen3-32b",
}  # fmt: skip
#: torchtune LoRA module names -> the HF names vramlens's model specs use.
_ATTN_MODULES: Final = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
_MLP_MODULES: Final = ("gate_proj", "up_proj", "down_proj")
_OPTIMIZERS: Final = {
    "torch.optim.AdamW": "adamw", "torch.optim.Adam": "adamw",
    "bitsandbytes.optim.AdamW8bit": "adamw-8bit", "bitsandbytes.optim.PagedAdamW8bit": "paged-adamw-8bit",
    "bitsandbytes.optim.PagedAdamW": "paged-adamw", "bitsandbytes.optim.PagedAdamW32bit": "paged-adamw",
    "torchao.optim.AdamW8bit": "adamw-8bit", "torchao.prototype.low_bit_optim.AdamW8bit": "adamw-8bit",
    "torch.optim.SGD": "sgd",
}  # fmt: skip
_LOSSES: Final = {
    "CEWithChunkedOutputLoss": ("chunked", "8 chunks of the logits, each cast to fp32 on its own"),
    "LinearCrossEntropyLoss": ("chunked", "the output projection and cross-entropy per chunk"),
    "CrossEntropyLoss": ("full", ""),
}
_USED: Final = frozenset({
    "model", "dtype", "batch_size", "gradient_accumulation_steps", "tokenizer", "dataset", "optimizer", "loss",
    "enable_activation_checkpointing", "enable_activation_offloading", "compile", "optimizer_in_bwd",
    "fsdp_cpu_offload", "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "data_parallel_shard_dim",
    "data_parallel_replicate_dim", "tensor_parallel_dim", "tensor_parallel_plan", "checkpointer",
})  # fmt: skip
_IGNORED: Final = frozenset({
    "output_dir", "epochs", "max_steps_per_epoch", "shuffle", "device", "lr_scheduler", "metric_logger",
    "log_every_n_steps", "log_peak_memory_stats", "log_level", "profiler", "resume_from_checkpoint",
    "save_adapter_weights_only", "clip_grad_norm", "custom_sharded_layers", "cudnn_deterministic_mode",
    "enable_kv_cache", "run_val_every_n_steps", "dataset_val", "batch_size_val", "seed", "recipe",
})  # fmt: skip


def detect(data: Any) -> bool:
    """torchtune configs instantiate components: ``model: {_component_: torchtune.models...}``."""
    model = data.get("model") if isinstance(data, Mapping) else None
    return isinstance(model, Mapping) and "_component_" in model


def read(data: Mapping[str, Any], ctx: ReadContext) -> SourcedWorkload:
    out = MappingBuilder(NAME)
    out.fixed("mode", "train", "a recipe config")
    out.fixed("framework", "torchtune", "the recipe")
    model = data.get("model")
    assert isinstance(model, Mapping)
    _model(out, model)
    _training(out, data)
    _optimizer(out, data.get("optimizer"))
    _loss(out, data.get("loss"))
    _parallel(out, data)
    list_leftovers(out, data, used=_USED, ignore=lambda key: ignored(key, _IGNORED, COMMON_IGNORED_PREFIXES))
    return out.result(ctx.origin)


def _component(block: Any) -> str:
    return str(block.get("_component_", "")) if isinstance(block, Mapping) else ""


def _model(out: MappingBuilder, model: Mapping[str, Any]) -> None:
    component = _component(model)
    builder = component.rsplit(".", 1)[-1]
    match = re.fullmatch(r"(q?lora_)?(.+)", builder)
    prefix, base = (match.group(1) or "", match.group(2)) if match else ("", builder)
    name = BUILDERS.get(base)
    if name is not None:
        out.set("model", name, "model._component_", shown=component)
    else:
        out.not_modelled("model._component_", component, "no catalog model for this builder; give MODEL")
    quantize = truthy(model.get("quantize_base"))
    if prefix == "qlora_" or quantize:
        out.set("method", "qlora", "model._component_", shown=builder)
        out.set("quant", "nf4-dq", "model._component_", shown=builder, why="torchao NF4Tensor, double-quantized scales")
    elif prefix == "lora_":
        out.set("method", "lora", "model._component_", shown=builder)
    else:
        out.set("method", "full", "model._component_", shown=builder)
        return
    _lora(out, model)


def _lora(out: MappingBuilder, model: Mapping[str, Any]) -> None:
    targets: list[str] = []
    modules = model.get("lora_attn_modules") or []
    if not isinstance(modules, list):
        raise out.fail(
            "model.lora_attn_modules", f"expected a list of q_proj, k_proj, v_proj, output_proj, got {short(modules)}"
        )
    for module in modules:
        if str(module) not in _ATTN_MODULES:
            raise out.fail(
                "model.lora_attn_modules", f"unknown module {module!r}; expected q_proj, k_proj, v_proj, output_proj"
            )
        targets.append(_ATTN_MODULES[str(module)])
    if truthy(model.get("apply_lora_to_mlp")):
        targets.extend(_MLP_MODULES)
    if truthy(model.get("apply_lora_to_output")):  # the output projection: lm_head (a LoRA head)
        targets.append("lm_head")
    if targets:
        extras = [flag for flag in ("mlp", "output") if truthy(model.get(f"apply_lora_to_{flag}"))]
        out.set("lora.targets", targets, "model.lora_attn_modules/apply_lora_to_mlp/apply_lora_to_output",
                shown=" + ".join([",".join(str(m) for m in model.get("lora_attn_modules") or []), *extras]))  # fmt: skip
    for source, target in (("lora_rank", "lora.rank"), ("lora_alpha", "lora.alpha"), ("lora_dropout", "lora.dropout")):
        if model.get(source) is not None:
            out.set(target, model[source], f"model.{source}")
    if truthy(model.get("use_dora")):
        out.not_modelled("model.use_dora", True, "DoRA magnitude vectors and their activations")


def _training(out: MappingBuilder, data: Mapping[str, Any]) -> None:
    dtype = data.get("dtype")
    if dtype is None:
        out.set("precision", "fp32", "dtype", shown="(not set)", why="training.get_dtype default")
    else:
        words = {
            "bf16": "bf16",
            "bfloat16": "bf16",
            "fp32": "fp32",
            "float32": "fp32",
            "fp16": "fp16",
            "float16": "fp16",
        }
        if str(dtype).strip().lower() not in words:
            raise out.fail("dtype", f"unknown value {dtype!r}; expected bf16 or fp32")
        out.set(
            "precision", words[str(dtype).strip().lower()], "dtype", why="weights, gradients and states in this dtype"
        )
    if data.get("batch_size") is not None:
        out.set("batch", data["batch_size"], "batch_size")
    if data.get("gradient_accumulation_steps") is not None:
        out.set("grad_accum", data["gradient_accumulation_steps"], "gradient_accumulation_steps")
    tokenizer = data.get("tokenizer")
    seq = tokenizer.get("max_seq_len") if isinstance(tokenizer, Mapping) else None
    if seq is not None:
        out.set("seq", seq, "tokenizer.max_seq_len")
    else:
        out.note("tokenizer.max_seq_len null: samples are not cut to a length; seq is the flag's (default 2048)", "seq")
    dataset = data.get("dataset")
    if isinstance(dataset, Mapping) and truthy(dataset.get("packed")):
        out.set("packing", True, "dataset.packed")
    checkpointing = truthy(data.get("enable_activation_checkpointing"))
    offloading = truthy(data.get("enable_activation_offloading"))
    if checkpointing:
        out.set("recompute", "offload" if offloading else "full", "enable_activation_checkpointing",
                shown=True if not offloading else "true + enable_activation_offloading")  # fmt: skip
    elif offloading:
        out.not_modelled(
            "enable_activation_offloading", True, "every saved activation offloaded, without checkpointing"
        )
    compiled = data.get("compile")
    if isinstance(compiled, Mapping):
        compiled = any(truthy(v) for v in compiled.values())
    if truthy(compiled):
        out.set("compile", True, "compile", shown=True)
    if truthy(data.get("optimizer_in_bwd")):
        out.set("optimizer_in_backward", True, "optimizer_in_bwd", shown=True)


def _optimizer(out: MappingBuilder, block: Any) -> None:
    component = _component(block)
    if not component:
        return
    name = _OPTIMIZERS.get(component)
    if name is None:
        out.not_modelled("optimizer._component_", component, "no memory model; the default adamw stands in")
        return
    out.set("optimizer", name, "optimizer._component_", shown=component)
    if name == "adamw" and isinstance(block, Mapping):
        fused = truthy(block.get("fused"))
        foreach = block.get("foreach")
        impl = "fused" if fused else ("per-tensor" if foreach is False else "foreach")
        why = "" if fused or foreach is not None else "torch's default on CUDA without fused=True"
        out.set("optimizer_impl", impl, "optimizer.fused", shown=block.get("fused", "(not set)"), why=why)


def _loss(out: MappingBuilder, block: Any) -> None:
    component = _component(block)
    if not component:
        return
    name = component.rsplit(".", 1)[-1]
    if name not in _LOSSES:
        out.not_modelled("loss._component_", component)
        return
    value, why = _LOSSES[name]
    out.set("loss", value, "loss._component_", shown=component, why=why)


def _parallel(out: MappingBuilder, data: Mapping[str, Any]) -> None:
    distributed = any(
        key in data
        for key in (
            "fsdp_cpu_offload",
            "fsdp_reshard_after_forward",
            "fsdp_sharding_strategy",
            "data_parallel_shard_dim",
            "tensor_parallel_dim",
        )
    )
    if not distributed:
        out.note("single-device recipe: 1 GPU")
        return
    out.set(
        "parallel.shard", "fsdp", "fsdp_* (a distributed recipe)", shown=True, why="FSDP2 over the data-parallel ranks"
    )
    if truthy(data.get("fsdp_cpu_offload")):
        out.set("parallel.offload", "optimizer+params", "fsdp_cpu_offload", shown=True,
                why="FSDP2 CPUOffloadPolicy: parameters, gradients and the optimizer step on the CPU")  # fmt: skip
    if data.get("fsdp_reshard_after_forward") is False:
        out.set("parallel.shard", "zero2", "fsdp_reshard_after_forward", shown=False,
                why="parameters stay gathered from forward to backward, as ZeRO-2")  # fmt: skip
    tp = data.get("tensor_parallel_dim")
    if tp not in (None, 1):
        out.set("parallel.tp", tp, "tensor_parallel_dim")
    out.note("GPUs: tune run --nproc_per_node decides, not the config; pass --gpus N", "parallel.gpus")
