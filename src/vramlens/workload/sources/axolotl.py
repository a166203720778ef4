"""axolotl YAML (``axolotl train config.yml``) -> workload.

Keys and defaults follow axolotl's ``AxolotlInputConfig`` (``axolotl/utils/schemas/config.py``):
``sequence_len`` 512, ``bf16: auto`` (bf16 on GPUs that have it), ``gradient_checkpointing``
false / true / ``offload`` / ``unsloth``; the model is loaded in ``torch_dtype`` bf16 when bf16
is on, so weights, gradients and AdamW states are bf16 (workload ``precision: bf16``). QLoRA's
bitsandbytes config is NF4 with double quantization (``loaders/model.py``: ``bnb_4bit_quant_type
"nf4"``, ``bnb_4bit_use_double_quant True``). The GPU count is the launcher's (accelerate /
torchrun), not the config's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from vramlens.workload.sources._common import (
    COMMON_IGNORED_PREFIXES,
    HF_ATTENTION,
    ignored,
    list_leftovers,
    map_hf_optimizer,
)
from vramlens.workload.sources._mapping import MappingBuilder, SourcedWorkload
from vramlens.workload.sources._text import as_int, truthy
from vramlens.workload.sources._text import or_empty as _or_empty
from vramlens.workload.sources.shared import ReadContext, map_fsdp_words, merge_deepspeed

__all__ = ["detect", "read"]

NAME: Final = "axolotl"

_USED: Final = frozenset({
    "base_model", "adapter", "load_in_8bit", "load_in_4bit", "lora_r", "lora_alpha", "lora_dropout",
    "lora_target_modules", "lora_target_linear", "lora_modules_to_save", "sequence_len", "micro_batch_size",
    "gradient_accumulation_steps", "batch_size", "sample_packing", "gradient_checkpointing", "activation_offloading",
    "bf16", "fp16", "bfloat16", "float16", "float32", "tf32", "optimizer", "flash_attention", "sdp_attention",
    "xformers_attention", "eager_attention", "torch_compile", "liger_fused_linear_cross_entropy", "cut_cross_entropy",
    "chunked_cross_entropy", "deepspeed", "fsdp", "fsdp_config", "fsdp_version", "plugins",
})  # fmt: skip
_IGNORED: Final = frozenset({
    "base_model_config", "model_type", "tokenizer_type", "strict", "datasets", "test_datasets", "val_set_size",
    "special_tokens", "tokens", "train_on_inputs", "group_by_length", "lr_scheduler", "gradient_checkpointing_kwargs",
    "lora_model_dir", "lora_fan_in_fan_out", "pad_to_sequence_len", "eval_sample_packing", "flash_attn_rms_norm",
    "flash_attn_cross_entropy", "is_llama_derived_model", "is_mistral_derived_model", "is_qwen_derived_model",
    "is_falcon_derived_model", "saves_per_epoch", "evals_per_epoch", "shuffle_merged_datasets", "micro_batch_size_eval",
    "fsdp_final_state_dict_type", "liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_layer_norm",
    "strict_mode", "ddp", "world_size", "device", "optim_args", "optim_target_modules", "max_prompt_len",
    "remove_unused_columns", "torch_compile_backend", "torch_compile_mode", "neftune_noise_alpha", "lora_on_cpu",
    "sample_packing_group_size", "sample_packing_bin_size", "special_tokens_overrides", "rl_beta", "default_system_message",
    "low_cpu_mem_usage", "gc_steps", "loss_watchdog_threshold", "loss_watchdog_patience", "include_tokens_per_second",
})  # fmt: skip
_PREFIXES: Final = (*COMMON_IGNORED_PREFIXES, "bench_", "do_", "test_", "val_", "max_grad")
_ATTENTION: Final = {
    "flash_attention": "flash",
    "sdp_attention": "sdpa",
    "xformers_attention": "efficient",
    "eager_attention": "eager",
}


def detect(data: Any) -> bool:
    """An axolotl config names its model ``base_model`` (a workload file says ``model``)."""
    return isinstance(data, Mapping) and "base_model" in data


def read(data: Mapping[str, Any], ctx: ReadContext) -> SourcedWorkload:
    out = MappingBuilder(NAME)
    out.fixed("mode", "train", "a training config")
    out.fixed("framework", "hf", "axolotl trains with transformers' Trainer")
    if data.get("base_model") is not None:
        out.set("model", str(data["base_model"]), "base_model")
    _method(out, data)
    _batch(out, data)
    _precision(out, data)
    _recompute(out, data)
    _kernels(out, data)
    if data.get("optimizer") is not None:
        map_hf_optimizer(out, "optimizer", data["optimizer"])
    else:
        out.note("optimizer not set: the Trainer's default adamw_torch_fused (optimizer adamw, fused)")
    _sharding(out, data, ctx)
    out.note("GPUs: not in an axolotl config (accelerate/torchrun decide); pass --gpus N for more than 1")
    list_leftovers(out, data, used=_USED, ignore=lambda key: ignored(key, _IGNORED, _PREFIXES))
    return out.result(ctx.origin)


def _method(out: MappingBuilder, data: Mapping[str, Any]) -> None:
    adapter = data.get("adapter")
    if adapter in (None, ""):
        out.set("method", "full", "adapter", shown="none")
        if truthy(data.get("load_in_8bit")) or truthy(data.get("load_in_4bit")):
            raise out.fail("load_in_8bit", "quantized loading needs 'adapter: lora' or 'adapter: qlora'")
        return
    text = str(adapter).strip().lower()
    if text not in ("lora", "qlora"):
        raise out.fail("adapter", f"unknown adapter {adapter!r}; vramlens models lora and qlora")
    if text == "qlora" or truthy(data.get("load_in_4bit")):
        out.set("method", "qlora", "adapter", shown=adapter)
        out.set("quant", "nf4-dq", "load_in_4bit", shown=data.get("load_in_4bit", True), why="NF4, double quantization")
    else:
        out.set("method", "lora", "adapter", shown=adapter)
        if truthy(data.get("load_in_8bit")):
            out.set("quant", "int8", "load_in_8bit", shown=True)
    if data.get("lora_r") is not None:
        out.set("lora.rank", data["lora_r"], "lora_r")
    if data.get("lora_alpha") is not None:
        out.set("lora.alpha", data["lora_alpha"], "lora_alpha")
    if data.get("lora_dropout") is not None:
        out.set("lora.dropout", data["lora_dropout"], "lora_dropout")
    if truthy(data.get("lora_target_linear")):
        out.set("lora.targets", "all-linear", "lora_target_linear", shown=True)
    elif data.get("lora_target_modules"):
        out.set("lora.targets", data["lora_target_modules"], "lora_target_modules")
    if data.get("lora_modules_to_save"):
        out.set("lora.modules_to_save", data["lora_modules_to_save"], "lora_modules_to_save")


def _batch(out: MappingBuilder, data: Mapping[str, Any]) -> None:
    micro = data.get("micro_batch_size")
    accum = data.get("gradient_accumulation_steps")
    total = data.get("batch_size")
    if micro is not None:
        out.set("batch", micro, "micro_batch_size")
    else:
        out.set("batch", 1, "micro_batch_size", shown="(not set)", why="axolotl's default 1")
    if accum is not None:
        out.set("grad_accum", accum, "gradient_accumulation_steps")
    elif total is not None:
        micro_n = as_int(f"{NAME} micro_batch_size", micro if micro is not None else 1)
        total_n = as_int(f"{NAME} batch_size", total)
        if micro_n < 1 or total_n % micro_n:
            raise out.fail("batch_size", f"{total_n} is not a multiple of micro_batch_size {micro_n}")
        out.set("grad_accum", total_n // micro_n, "batch_size", why="batch_size / micro_batch_size on one GPU")
    if data.get("sequence_len") is not None:
        out.set("seq", data["sequence_len"], "sequence_len")
    else:
        out.set("seq", 512, "sequence_len", shown="(not set)", why="axolotl's default 512")
    if truthy(data.get("sample_packing")):
        out.set("packing", True, "sample_packing")


def _precision(out: MappingBuilder, data: Mapping[str, Any]) -> None:
    bf16 = data.get("bf16", "auto")
    if truthy(data.get("bfloat16")) or bf16 is True or str(bf16).lower() == "true":
        out.set("precision", "bf16", "bf16", shown=bf16, why="model loaded in bf16: bf16 weights, gradients, states")
    elif truthy(data.get("fp16")) or truthy(data.get("float16")):
        out.set("precision", "fp16", "fp16", shown=True, why="model loaded in fp16")
    elif str(bf16).lower() == "auto":
        out.set(
            "precision", "bf16", "bf16", shown="auto", why="auto is bf16 on GPUs that support it (Ampere and newer)"
        )
    else:
        out.set("precision", "fp32", "bf16", shown=bf16, why="neither bf16 nor fp16: fp32")


def _recompute(out: MappingBuilder, data: Mapping[str, Any]) -> None:
    checkpointing = data.get("gradient_checkpointing")
    offload = truthy(data.get("activation_offloading"))
    if isinstance(checkpointing, str) and checkpointing.strip().lower() in ("offload", "unsloth"):
        out.set(
            "recompute", "offload", "gradient_checkpointing", shown=checkpointing, why="checkpoints kept in CPU memory"
        )
    elif truthy(checkpointing):
        value = "offload" if offload else "full"
        out.set("recompute", value, "gradient_checkpointing", shown=checkpointing, why="every decoder layer")
    elif offload:
        out.not_modelled("activation_offloading", True, "offloading without checkpointing")


def _kernels(out: MappingBuilder, data: Mapping[str, Any]) -> None:
    chosen = [key for key in _ATTENTION if truthy(data.get(key))]
    if len(chosen) > 1:
        raise out.fail(chosen[1], f"only one attention kernel may be on; got {', '.join(chosen)}")
    if chosen:
        out.set("attention", _ATTENTION[chosen[0]], chosen[0], shown=True)
    if data.get("attn_implementation") in HF_ATTENTION:
        out.set("attention", HF_ATTENTION[str(data["attn_implementation"])], "attn_implementation")
    if truthy(data.get("torch_compile")):
        out.set("compile", True, "torch_compile", shown=data.get("torch_compile"))
    if truthy(data.get("liger_fused_linear_cross_entropy")) or truthy(data.get("cut_cross_entropy")):
        key = "cut_cross_entropy" if truthy(data.get("cut_cross_entropy")) else "liger_fused_linear_cross_entropy"
        out.set("loss", "fused-linear", key, shown=True)
    elif truthy(data.get("chunked_cross_entropy")):
        out.set("loss", "chunked", "chunked_cross_entropy", shown=True)


def _sharding(out: MappingBuilder, data: Mapping[str, Any], ctx: ReadContext) -> None:
    if data.get("deepspeed"):
        merge_deepspeed(out, "deepspeed", data["deepspeed"], ctx)
    fsdp = data.get("fsdp")
    config = _or_empty(data.get("fsdp_config"))
    if fsdp or config or data.get("fsdp_version") or not isinstance(config, Mapping):
        if not isinstance(config, Mapping):
            raise out.fail("fsdp_config", f"expected a mapping, got {type(config).__name__}")
        words = fsdp if isinstance(fsdp, list) else str(fsdp or "full_shard").split()
        map_fsdp_words(out, "fsdp", [str(w) for w in words], config, version=data.get("fsdp_version"))
