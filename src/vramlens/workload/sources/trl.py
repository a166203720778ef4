"""A TRL / HF ``TrainingArguments`` command line (``trl sft ...``, ``accelerate launch train.py ...``,
``torchrun --nproc_per_node 8 train.py ...``) -> workload.

Arguments as ``HfArgumentParser`` reads them (``--flag``, ``--flag true``, ``--flag=value``; a
bare boolean flag is true): ``TrainingArguments`` (``--per_device_train_batch_size``,
``--gradient_accumulation_steps``, ``--gradient_checkpointing``, ``--optim``, ``--bf16``,
``--fp16``, ``--torch_compile``, ``--fsdp``, ``--deepspeed``, ``--use_liger_kernel``), TRL's
``SFTConfig`` (``--max_length``, formerly ``--max_seq_length``, default 1024; ``--packing``) and
``ModelConfig`` (``--model_name_or_path``, ``--dtype``/``--torch_dtype``, ``--attn_implementation``,
``--use_peft``, ``--lora_r``, ``--lora_alpha``, ``--lora_dropout``, ``--lora_target_modules``,
``--lora_modules_to_save``, ``--load_in_4bit`` with ``--bnb_4bit_quant_type`` (nf4) and
``--use_bnb_nested_quant``, ``--load_in_8bit``). The launcher's process count
(``--nproc_per_node``, ``--num_processes``, ``--num_gpus``) gives the GPUs. With ``--bf16`` and
no ``--dtype``, the model's weights stay fp32 under autocast (``mixed-bf16``); with ``--dtype
bfloat16`` they are bf16 (``bf16``). ``PYTORCH_CUDA_ALLOC_CONF=...`` in front of the command (or
exported) sets ``alloc_conf``.
"""

from __future__ import annotations

from typing import Any, Final

from vramlens.errors import InputError
from vramlens.workload.sources._common import HF_ATTENTION, map_hf_optimizer
from vramlens.workload.sources._mapping import MappingBuilder, SourcedWorkload
from vramlens.workload.sources._text import Arguments, as_bool, as_int, parse_command
from vramlens.workload.sources.shared import (
    ReadContext,
    map_environment,
    map_fsdp_words,
    merge_deepspeed,
    read_reference,
)

__all__ = ["detect", "read"]

NAME: Final = "trl"

#: Options that only a TrainingArguments / TRL command line has.
MARKERS: Final = frozenset({
    "per_device_train_batch_size", "model_name_or_path", "gradient_accumulation_steps", "output_dir",
    "use_peft", "num_train_epochs",
})  # fmt: skip
_LAUNCH_GPUS: Final = ("nproc_per_node", "num_processes", "num_gpus")
_USED: Final = frozenset({
    "per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing", "optim", "bf16", "fp16",
    "max_length", "max_seq_length", "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
    "lora_modules_to_save", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "use_bnb_nested_quant",
    "model_name_or_path", "dtype", "torch_dtype", "attn_implementation", "packing", "torch_compile",
    "use_liger_kernel", "fsdp", "fsdp_config", "deepspeed", "config_file", "nnodes", "num_machines", *_LAUNCH_GPUS,
})  # fmt: skip
#: Options known to matter for memory that a workload cannot say (RL trainers, generation in the loop).
_RELEVANT: Final = frozenset({
    "max_prompt_length", "max_completion_length", "num_generations", "use_vllm", "vllm_mode",
    "vllm_gpu_memory_utilization", "ref_model_init_kwargs", "precompute_ref_log_probs", "padding_free",
    "gradient_checkpointing_kwargs", "optim_target_modules", "use_dora", "use_rslora", "lora_task_type",
    "torch_empty_cache_steps", "activation_offloading", "model_init_kwargs", "rpo_alpha", "reward_model_path",
    "sft_model_path", "num_mini_batches", "local_rollout_forward_batch_size", "response_length",
})  # fmt: skip
_DTYPES: Final = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "fp32": "fp32",
}
_QUANT4: Final = {"nf4": "nf4", "fp4": None}


def detect(tokens: list[str]) -> bool:
    """A command line with TrainingArguments' own options (and no ``vllm serve``)."""
    names = {token.lstrip("-").split("=", 1)[0].replace("-", "_") for token in tokens if token.startswith("--")}
    return bool(names & MARKERS)


def read(tokens: list[str], ctx: ReadContext) -> SourcedWorkload:
    out = MappingBuilder(NAME)
    out.fixed("mode", "train", "a training command")
    args = parse_command(tokens)
    trl = _is_trl(args, tokens)
    if trl:
        out.fixed("framework", "trl", "TRL's trainer: transformers Trainer with TRL's fused LM head")
    else:
        out.fixed("framework", "hf", "transformers Trainer")
    out.note(
        "TRL trainer defaults (gradient_checkpointing and bf16 on, trl/trainer/base_config.py)"
        if trl
        else "transformers TrainingArguments defaults (no TRL script or TRL-only option seen)"
    )
    _launcher(out, args, ctx)
    map_environment(out, tokens)
    if args.value("model_name_or_path"):
        out.set("model", args.value("model_name_or_path"), "--model_name_or_path")
    _batch(out, args, tokens, trl=trl)
    _precision(out, args, trl=trl)
    _peft(out, args)
    _kernels(out, args, trl=trl)
    _sharding(out, args, ctx)
    for name in sorted(set(args.options) & _RELEVANT):
        out.not_modelled(args.spelled[name], " ".join(args.options[name]) or "true")
    return out.result(ctx.origin)


#: Options only TRL's configs have (a plain TrainingArguments script has none of them).
_TRL_ONLY: Final = frozenset({"use_peft", "max_length", "max_seq_length", "packing", "lora_r", "load_in_4bit",
                              "max_prompt_length", "max_completion_length", "num_generations", "dataset_name"})  # fmt: skip
_TRL_SCRIPTS: Final = frozenset({"sft.py", "dpo.py", "grpo.py", "kto.py", "reward_modeling.py", "rloo.py", "orpo.py"})


def _is_trl(args: Arguments, tokens: list[str]) -> bool:
    """TRL's CLI (``trl sft``), one of its scripts, or a TRL-only option."""
    words = {token.replace("\\", "/").rsplit("/", 1)[-1] for token in tokens if not token.startswith("-")}
    return "trl" in words or bool(words & _TRL_SCRIPTS) or bool(set(args.options) & _TRL_ONLY)


def _flag(args: Arguments, name: str) -> bool:
    return args.has(name) and as_bool(f"{NAME} {args.spelled[name]}", args.options[name])


def _launcher(out: MappingBuilder, args: Arguments, ctx: ReadContext) -> None:
    if args.value("config_file"):
        found = read_reference(ctx, str(args.value("config_file")))
        if found is None:
            out.not_modelled("--config_file", args.value("config_file"), "accelerate config not found beside the file")
        else:
            from vramlens.workload.sources import accelerate
            from vramlens.workload.sources._text import parse_document

            path, text = found
            data = parse_document(text, str(path), json_first=False)
            if not isinstance(data, dict):
                raise out.fail("--config_file", f"{path.name} is not an accelerate config mapping")
            inner = accelerate.read(data, ReadContext(origin=path.name, directory=ctx.directory, depth=ctx.depth + 1))
            out.keys.update({k: (dict(v) if isinstance(v, dict) else v) for k, v in inner.keys.items() if k != "mode"})
            out.notes.extend(inner.notes)
            out.unmodelled.extend(inner.unmodelled)
    name = next((n for n in _LAUNCH_GPUS if args.value(n)), None)
    if name is not None:
        per_node = as_int(f"{NAME} {args.spelled[name]}", args.value(name))
        nodes_name = "nnodes" if args.value("nnodes") else "num_machines"
        nodes = as_int(f"{NAME} --{nodes_name}", args.value(nodes_name) or 1) if name == "nproc_per_node" else 1
        out.set("parallel.gpus", per_node * nodes, args.spelled[name], shown=args.value(name),
                why=f"x {nodes} nodes" if nodes > 1 else "one process per GPU")  # fmt: skip
    elif not out.has("parallel.gpus"):
        out.note("GPUs: no launcher process count in the command; 1 (pass --gpus N)", "parallel.gpus")


def _batch(out: MappingBuilder, args: Arguments, tokens: list[str], *, trl: bool) -> None:
    if args.value("per_device_train_batch_size"):
        out.set("batch", args.value("per_device_train_batch_size"), "--per_device_train_batch_size")
    else:
        out.set("batch", 8, "--per_device_train_batch_size", shown="(not set)", why="TrainingArguments default 8")
    if args.value("gradient_accumulation_steps"):
        out.set("grad_accum", args.value("gradient_accumulation_steps"), "--gradient_accumulation_steps")
    length = next((n for n in ("max_length", "max_seq_length") if args.value(n)), None)
    if length is not None:
        out.set("seq", args.value(length), args.spelled[length])
    elif trl:
        out.set("seq", 1024, "--max_length", shown="(not set)", why="TRL's default 1024 (SFTConfig, DPOConfig)")
    else:
        out.note("no --max_length: the longest sample decides; seq is the flag's (default 2048)", "seq")
    if _flag(args, "packing"):
        out.set("packing", True, "--packing", shown=True)
    if args.has("gradient_checkpointing"):
        if _flag(args, "gradient_checkpointing"):
            out.set("recompute", "full", "--gradient_checkpointing", shown=True, why="every decoder layer")
        else:
            out.set("recompute", "none", "--gradient_checkpointing", shown=False)
    elif trl:
        out.set("recompute", "full", "--gradient_checkpointing", shown="(not set)", why="TRL's default True")
    if args.value("optim"):
        map_hf_optimizer(out, "--optim", args.value("optim"))
    else:
        out.note("--optim not set: the Trainer's default adamw_torch_fused (adamw, fused)", "optimizer")


def _precision(out: MappingBuilder, args: Arguments, *, trl: bool) -> None:
    dtype_name = next((n for n in ("dtype", "torch_dtype") if args.value(n)), None)
    dtype = str(args.value(dtype_name)).strip().lower() if dtype_name else None
    if dtype is not None and dtype not in _DTYPES and dtype != "auto":
        raise out.fail(
            args.spelled[dtype_name or "dtype"], f"unknown value {dtype!r}; expected bfloat16, float16, float32 or auto"
        )
    fp16 = _flag(args, "fp16")
    bf16 = _flag(args, "bf16") if args.has("bf16") else (trl and not fp16)
    if dtype == "auto":
        out.not_modelled(args.spelled[dtype_name or "dtype"], "auto", "the checkpoint's own dtype")
    if dtype in _DTYPES and _DTYPES[dtype] != "fp32":
        out.set("precision", _DTYPES[dtype], args.spelled[dtype_name or "dtype"], shown=dtype,
                why="weights loaded in this dtype: weights, gradients and AdamW states too")  # fmt: skip
    elif bf16:
        shown = True if args.has("bf16") else "(not set)"
        why = "autocast over fp32 weights" + ("" if args.has("bf16") else "; TRL's default without --fp16")
        out.set("precision", "mixed-bf16", "--bf16", shown=shown, why=why)
    elif fp16:
        out.set("precision", "mixed-fp16", "--fp16", shown=True, why="autocast over fp32 weights")
    else:
        out.set("precision", "fp32", "--bf16/--fp16", shown="(not set)", why="no mixed precision: fp32")


def _peft(out: MappingBuilder, args: Arguments) -> None:
    four, eight = _flag(args, "load_in_4bit"), _flag(args, "load_in_8bit")
    if not _flag(args, "use_peft"):
        out.set("method", "full", "--use_peft", shown="(not set)")
        if four or eight:
            raise out.fail("--load_in_4bit", "a quantized model is trained with --use_peft only")
        return
    if four:
        kind = str(args.value("bnb_4bit_quant_type") or "nf4").strip().lower()
        if _QUANT4.get(kind) is None:
            raise out.fail("--bnb_4bit_quant_type", f"{kind!r} is not modelled; vramlens models nf4")
        nested = _flag(args, "use_bnb_nested_quant")
        out.set("method", "qlora", "--use_peft --load_in_4bit", shown=True)
        out.set("quant", "nf4-dq" if nested else "nf4", "--bnb_4bit_quant_type", shown=kind,
                why="double quantization (--use_bnb_nested_quant)" if nested else "no double quantization (TRL's default)")  # fmt: skip
    else:
        out.set("method", "lora", "--use_peft", shown=True)
        if eight:
            out.set("quant", "int8", "--load_in_8bit", shown=True)
    for name, target in (("lora_r", "lora.rank"), ("lora_alpha", "lora.alpha"), ("lora_dropout", "lora.dropout")):
        if args.value(name):
            out.set(target, args.value(name), args.spelled[name])
    if args.options.get("lora_target_modules"):
        values = args.options["lora_target_modules"]
        out.set(
            "lora.targets",
            values[0] if values == ["all-linear"] else values,
            args.spelled["lora_target_modules"],
            shown=" ".join(values),
        )
    if args.options.get("lora_modules_to_save"):
        out.set("lora.modules_to_save", args.options["lora_modules_to_save"], args.spelled["lora_modules_to_save"])


def _kernels(out: MappingBuilder, args: Arguments, *, trl: bool) -> None:
    attention = args.value("attn_implementation")
    if attention:
        if attention in HF_ATTENTION:
            out.set("attention", HF_ATTENTION[attention], "--attn_implementation", shown=attention)
        else:
            out.not_modelled("--attn_implementation", attention)
    if _flag(args, "torch_compile"):
        out.set("compile", True, "--torch_compile", shown=True)
    if _flag(args, "use_liger_kernel") and trl:
        out.note("--use_liger_kernel: TRL 1.16 applies Liger's layer kernels only; the loss stays TRL's fused head")
    elif _flag(args, "use_liger_kernel"):
        out.set("loss", "fused-linear", "--use_liger_kernel", shown=True, why="Liger's fused linear cross-entropy")


def _sharding(out: MappingBuilder, args: Arguments, ctx: ReadContext) -> None:
    if args.value("deepspeed"):
        merge_deepspeed(out, "--deepspeed", args.value("deepspeed"), ctx)
    fsdp = args.options.get("fsdp")
    if fsdp:
        words = " ".join(fsdp).split()
        config: dict[str, Any] = {}
        if args.value("fsdp_config"):
            config = _fsdp_config(out, str(args.value("fsdp_config")), ctx)
        map_fsdp_words(out, "--fsdp", words, config)
    gpus = out.keys.get("parallel", {}).get("gpus", 1)
    if gpus > 1 and not out.has("parallel.shard"):
        out.set(
            "parallel.shard",
            "ddp",
            "(no --fsdp or --deepspeed)",
            shown=f"{gpus} processes",
            why="DistributedDataParallel",
        )


def _fsdp_config(out: MappingBuilder, value: str, ctx: ReadContext) -> dict[str, Any]:
    from vramlens._untrusted import load_json

    text = value
    if not value.lstrip().startswith("{"):
        found = read_reference(ctx, value)
        if found is None:
            out.not_modelled("--fsdp_config", value, "file not found beside the command")
            return {}
        text = found[1]
    try:
        data = load_json(text, name="--fsdp_config")
    except InputError:
        raise out.fail("--fsdp_config", "not a JSON object") from None
    if not isinstance(data, dict):
        raise out.fail("--fsdp_config", "not a JSON object")
    return data
