"""litgpt YAML (``litgpt finetune_lora --config file.yaml``, ``litgpt finetune_full``, ``litgpt pretrain``) -> workload.

As ``litgpt/finetune/lora.py`` and ``full.py`` read it: ``checkpoint_dir`` names the model
(``checkpoints/<org>/<name>``); ``precision`` is a Lightning string (``bf16-true`` pure bf16,
``bf16-mixed`` autocast over fp32 weights, ``16-true``, ``16-mixed``, ``32-true``); ``quantize``
``bnb.nf4`` / ``bnb.nf4-dq`` / ``bnb.int8`` freezes a quantized base (with LoRA: QLoRA);
``devices`` x ``num_nodes`` processes, and with more than one the scripts shard one unit per
``Block`` and checkpoint every Block: ``finetune_lora`` with Fabric's ``ModelParallelStrategy``
(``parallelize_fn``: FSDP2 ``fully_shard`` per checkpoint-wrapped Block and on the root),
``finetune_full`` with ``FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block},
cpu_offload=False)`` (FSDP1; the estimator's litgpt profile tells them apart by the method); ``train.micro_batch_size``, ``train.global_batch_size`` (accumulation is
``global / (devices x num_nodes) / micro``), ``train.max_seq_length``; ``lora_query``,
``lora_key``, ``lora_value``, ``lora_projection``, ``lora_mlp``, ``lora_head``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from vramlens.workload.sources._common import COMMON_IGNORED_PREFIXES, ignored, list_leftovers
from vramlens.workload.sources._mapping import MappingBuilder, SourcedWorkload
from vramlens.workload.sources._text import as_int, truthy
from vramlens.workload.sources._text import or_empty as _or_empty
from vramlens.workload.sources.shared import ReadContext

__all__ = ["detect", "read"]

NAME: Final = "litgpt"

#: Lightning precision strings -> workload precision.
PRECISIONS: Final = {
    "32-true": "fp32", "32": "fp32", "bf16-true": "bf16", "bf16-mixed": "mixed-bf16",
    "16-true": "fp16", "16-mixed": "mixed-fp16", "16": "mixed-fp16", "bf16": "mixed-bf16",
}  # fmt: skip
_QUANTIZE: Final = {"bnb.nf4": "nf4", "bnb.nf4-dq": "nf4-dq", "bnb.int8": "int8", "bnb.int8-training": "int8"}
_LORA_FLAGS: Final = {
    "lora_query": ("q_proj",), "lora_key": ("k_proj",), "lora_value": ("v_proj",), "lora_projection": ("o_proj",),
    "lora_mlp": ("gate_proj", "up_proj", "down_proj"), "lora_head": ("lm_head",),
}  # fmt: skip
_OPTIMIZERS: Final = {
    "adamw": "adamw", "torch.optim.adamw": "adamw", "adam": "adamw", "torch.optim.adam": "adamw", "sgd": "sgd",
    "torch.optim.sgd": "sgd", "bitsandbytes.optim.pagedadamw": "paged-adamw",
    "bitsandbytes.optim.pagedadamw8bit": "paged-adamw-8bit", "bitsandbytes.optim.adamw8bit": "adamw-8bit",
}  # fmt: skip
_USED: Final = frozenset({
    "checkpoint_dir", "precision", "quantize", "devices", "num_nodes", "train", "optimizer", "lora_r", "lora_alpha",
    "lora_dropout", *_LORA_FLAGS,
})  # fmt: skip
_IGNORED: Final = frozenset(
    {"out_dir", "data", "eval", "logger_name", "access_token", "initial_checkpoint_dir", "model_name"}
)
_TRAIN_USED: Final = frozenset({"micro_batch_size", "global_batch_size", "max_seq_length"})
_TRAIN_IGNORED: Final = frozenset({
    "save_interval", "log_interval", "lr_warmup_steps", "lr_warmup_fraction", "epochs", "max_tokens", "max_steps",
    "tie_embeddings", "max_norm", "min_lr",
})  # fmt: skip


def detect(data: Any) -> bool:
    """litgpt configs name ``checkpoint_dir`` or hold a ``train:`` block beside a Lightning ``precision``."""
    return isinstance(data, Mapping) and (
        "checkpoint_dir" in data or (isinstance(data.get("train"), Mapping) and "precision" in data)
    )


def read(data: Mapping[str, Any], ctx: ReadContext) -> SourcedWorkload:
    out = MappingBuilder(NAME)
    out.fixed("mode", "train", "a finetune/pretrain config")
    out.fixed("framework", "litgpt", "the litgpt scripts")
    if data.get("checkpoint_dir"):
        parts = str(data["checkpoint_dir"]).replace("\\", "/").rstrip("/").split("/")
        model = "/".join(parts[-2:]) if len(parts) >= 2 and parts[-3:-2] == ["checkpoints"] else "/".join(parts)
        out.set("model", model, "checkpoint_dir", why="the HF repository under checkpoints/")
    _precision(out, data)
    processes = _devices(out, data)
    _batch(out, data, processes)
    _optimizer(out, data.get("optimizer"))
    list_leftovers(out, data, used=_USED, ignore=lambda key: ignored(key, _IGNORED, COMMON_IGNORED_PREFIXES))
    train = data.get("train")
    if isinstance(train, Mapping):
        list_leftovers(out, train, used=_TRAIN_USED, ignore=lambda key: key in _TRAIN_IGNORED, prefix="train.")
    return out.result(ctx.origin)


def _precision(out: MappingBuilder, data: Mapping[str, Any]) -> None:
    raw = data.get("precision")
    if raw is None:
        out.set("precision", "mixed-bf16", "precision", shown="(not set)",
                why="litgpt's training default on bf16 GPUs (get_default_supported_precision)")  # fmt: skip
    else:
        text = str(raw).strip().lower()
        if text not in PRECISIONS:
            raise out.fail("precision", f"unknown value {raw!r}; expected one of {', '.join(PRECISIONS)}")
        out.set("precision", PRECISIONS[text], "precision", shown=raw)
    lora = any(key in data for key in ("lora_r", *_LORA_FLAGS))
    quantize = data.get("quantize")
    if quantize:
        text = str(quantize).strip().lower()
        if text not in _QUANTIZE:
            raise out.fail("quantize", f"unknown value {quantize!r}; expected one of {', '.join(_QUANTIZE)}")
        if not lora:
            raise out.fail("quantize", "a quantized base is trained with LoRA only (litgpt finetune_lora)")
        method = "qlora" if _QUANTIZE[text].startswith("nf4") else "lora"
        out.set("method", method, "quantize", shown=quantize)
        out.set("quant", _QUANTIZE[text], "quantize", shown=quantize)
    elif lora:
        out.set("method", "lora", "lora_* keys", shown="present")
    else:
        out.set("method", "full", "lora_* keys", shown="absent")
    if lora:
        _lora(out, data)


def _lora(out: MappingBuilder, data: Mapping[str, Any]) -> None:
    for source, target in (("lora_r", "lora.rank"), ("lora_alpha", "lora.alpha"), ("lora_dropout", "lora.dropout")):
        if data.get(source) is not None:
            out.set(target, data[source], source)
    targets = [name for flag, names in _LORA_FLAGS.items() if truthy(data.get(flag)) for name in names]
    if not targets:
        raise out.fail(
            "lora_query",
            "no LoRA target is on (lora_query, lora_key, lora_value, lora_projection, lora_mlp, lora_head)",
        )
    out.set(
        "lora.targets",
        targets,
        "lora_query/key/value/projection/mlp/head",
        shown=",".join(f for f in _LORA_FLAGS if truthy(data.get(f))),
    )


def _devices(out: MappingBuilder, data: Mapping[str, Any]) -> int:
    raw = data.get("devices", 1)
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        out.not_modelled("devices", raw, "every visible GPU; pass --gpus N")
        return 1
    devices = as_int(f"{NAME} devices", raw)
    nodes = as_int(f"{NAME} num_nodes", data.get("num_nodes", 1))
    if devices < 1 or nodes < 1:
        raise out.fail("devices", f"devices and num_nodes must be >= 1, got {raw!r} and {data.get('num_nodes', 1)!r}")
    processes = devices * nodes
    if processes > 1 and out.has("quant"):
        raise out.fail("quantize", "litgpt supports quantization on one device only (devices: 1)")
    out.set("parallel.gpus", processes, "devices x num_nodes", shown=f"{devices} x {nodes}")
    if processes > 1:
        out.set("parallel.shard", "fsdp", "devices", shown=devices, why="litgpt shards over more than one device")
        out.set(
            "fsdp_wrap",
            "root",
            "devices",
            shown=devices,
            why="one unit per Block, the rest in the root (finetune_lora: FSDP2 fully_shard; "
            "finetune_full: Lightning's FSDPStrategy, FSDP1)",
        )
        out.set(
            "recompute", "full", "devices", shown=devices, why="finetune_lora and finetune_full checkpoint every Block"
        )
    return processes


def _batch(out: MappingBuilder, data: Mapping[str, Any], processes: int) -> None:
    train = _or_empty(data.get("train"))
    if not isinstance(train, Mapping):
        raise out.fail("train", f"expected a mapping, got {type(train).__name__}")
    micro = as_int(f"{NAME} train.micro_batch_size", train.get("micro_batch_size", 4))
    shown = train.get("micro_batch_size", "(not set)")
    out.set(
        "batch",
        micro,
        "train.micro_batch_size",
        shown=shown,
        why="" if "micro_batch_size" in train else "TrainArgs default 4",
    )
    if train.get("global_batch_size") is not None:
        total = as_int(f"{NAME} train.global_batch_size", train["global_batch_size"])
        accum = total // processes // micro if micro >= 1 else 0
        if accum < 1:
            raise out.fail(
                "train.global_batch_size", f"{total} is less than micro_batch_size {micro} x {processes} devices"
            )
        out.set(
            "grad_accum", accum, "train.global_batch_size", shown=total, why=f"{total} / {processes} devices / {micro}"
        )
    if train.get("max_seq_length") is not None:
        out.set("seq", train["max_seq_length"], "train.max_seq_length")
    else:
        out.note("train.max_seq_length not set: the longest sample decides; seq is the flag's (default 2048)", "seq")


def _optimizer(out: MappingBuilder, block: Any) -> None:
    if block is None:
        out.note("optimizer not set: litgpt's AdamW (torch, foreach on CUDA)", "optimizer")
        return
    name = block.get("class_path", "") if isinstance(block, Mapping) else block
    key = str(name).strip().lower()
    if key not in _OPTIMIZERS:
        out.not_modelled("optimizer", name, "no memory model; the default adamw stands in")
        return
    out.set("optimizer", _OPTIMIZERS[key], "optimizer", shown=name)
