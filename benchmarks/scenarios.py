"""Turn the published measurements of ``shared/validation/public_scenarios.jsonl`` into workloads.

Each point names a model (``hf_config``), a configuration in normalized fields,
and a measured per-GPU peak with the level it measured (allocated, reserved,
active, or nvidia-smi/unknown = device). :func:`point_workload` maps a point to
the vramlens workload contract, or gives the reason it cannot be expressed.
Mappings that approximate (a PEFT method vramlens has no name for, a framework
it has no profile for) are returned as notes, and listed by the benchmark.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramlens.resolve.kernels import LIGER_PATCHES

#: A verbatim copy of shared/validation/public_scenarios.jsonl (see data/README.md).
VALIDATION = Path(__file__).resolve().parent / "data" / "public_scenarios.jsonl"
SHARED_VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation" / "public_scenarios.jsonl"

_FRAMEWORK = {
    "torchtitan": "torchtitan",
    "torchtune": "torchtune",
    "hf_trainer": "hf",
    "peft_script": "hf",
    "forgather": "hf",
    "axolotl": "hf",
    "deepspeed": "deepspeed",
    "megatron": "megatron",
    "litgpt": "litgpt",
}
_PRECISION = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "mixed_bf16": "mixed-bf16", "mixed_fp16": "mixed-fp16"}
_OPTIMIZER = {
    "adamw": "adamw",
    "adafactor": "adafactor",
    "adamw8bit": "adamw-8bit",
    "sgd": "sgd",
    "lion": "lion",
    "lora_fa": "adamw",
}
_TARGETS = {
    "q": "q_proj",
    "k": "k_proj",
    "v": "v_proj",
    "o": "o_proj",
    "gate": "gate_proj",
    "up": "up_proj",
    "down": "down_proj",
}
_SHARD = {
    "single": "none",
    "ddp": "ddp",
    "fsdp": "fsdp",
    "zero1": "zero1",
    "zero2": "zero2",
    "zero3": "zero3",
    "hsdp": "hsdp",
}
_OFFLOAD = {
    "none": "none",
    "optimizer": "optimizer",
    "params+optimizer": "optimizer+params",
    "optimizer+params": "optimizer+params",
}
_SCHEDULE = {"1f1b": "1f1b", "interleaved 1f1b": "interleaved-1f1b", "gpipe": "gpipe"}
_RECOMPUTE = {"none": "none", "selective": "selective", "full": "full"}
#: torchtitan versions named in the points' ``source``/``software`` -> the date of that version
#: (torchtitan git history). Two defaults changed in April 2025 (``_torchtitan_version_fixes``).
_TORCHTITAN_DATES = {
    "9dec370": "2024-12-26",
    # "0.0.2" is the version string of checkouts from 2024-12 to 2025-06; the run that names it used
    # torch 2.7.0a0 and torchao 0.10.0 dev builds (first quarter of 2025).
    "0.0.2": "2025-03",
    "e7c0cae": "2025-06-11",
    "2c8b594": "2025-08-08",
    "6fc499f": "2025-08-14",
}
#: bbb1b616e: build_cross_entropy_loss wraps the loss in torch.compile.
_TORCHTITAN_LOSS_COMPILED = "2025-04-02"
#: 5e2033c75: microbatch_size (default 1) replaces n_microbatches (default: the pp degree).
_TORCHTITAN_MICROBATCH_SIZE = "2025-04-07"
#: 83e694105: apply_fsdp makes tok_embeddings and [norm, output] units of their own (before: the
#: root held them, kept unsharded from forward to backward by FSDP2's root rule).
_TORCHTITAN_SPLIT_UNITS = "2025-07-28"
#: Measured kind -> report level to compare with.
LEVEL = {
    "allocated": "allocated",
    "active": "allocated",
    "reserved": "reserved",
    "unknown": "device",
    "nvidia_smi": "device",
}


@dataclass(kw_only=True)
class Mapped:
    """A point expressed as a workload (or why it cannot be)."""

    workload: dict[str, Any] | None
    level: str
    skip_reason: str | None = None
    notes: list[str] = field(default_factory=list)


def load_points(path: Path = VALIDATION, task: str = "train") -> list[dict[str, Any]]:
    """Usable points of one task."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row for row in rows if row["task"] == task and row.get("usable")]


def _method(point: dict[str, Any], workload: dict[str, Any], notes: list[str]) -> str | None:
    method = point["method"]
    lora = point.get("lora") or {}
    name = point["config_name"].lower()
    if method in ("lora", "qlora"):
        workload["method"] = method
        targets = [_TARGETS.get(t, t) for t in lora.get("target_modules") or []]
        workload["lora"] = {
            "rank": lora.get("r") or 16,
            "alpha": lora.get("alpha") or 32,
            "targets": targets or "all-linear",
        }
        if "dora" in name or "vera" in name:
            notes.append("DoRA/VeRA expressed as LoRA of the same rank and targets")
        if point["weight_quant"]:
            workload["quant"] = point["weight_quant"]
        return None
    if method == "full":
        return None
    if method == "other":
        workload["method"] = "lora"
        workload["lora"] = {"rank": 1, "targets": ["v_proj"]}
        notes.append(
            f"PEFT method '{point['config_name'].split('--')[0]}' expressed as a frozen base with a rank-1 adapter"
        )
        _prompt_tuning(point, workload, notes)
        return None
    return f"method {method!r} has no counterpart"


def prompt_tokens(trainable: int, hidden: int) -> int | None:
    """Virtual tokens of PEFT prompt tuning, from its trainable count (None if it does not divide).

    ``PromptEmbedding`` is one ``nn.Embedding(num_virtual_tokens, token_dim)``: its parameters are
    ``num_virtual_tokens x hidden`` (peft tuners/prompt_tuning/model.py, one transformer submodule
    for a decoder). ``PeftModelForCausalLM.forward`` concatenates these embeddings before the
    input embeddings and pads the labels with -100 (peft_model.py), so the base model runs on
    ``seq + num_virtual_tokens`` positions: longer activations, logits and loss.
    """
    return trainable // hidden if trainable and trainable % hidden == 0 else None


def _prompt_tuning(point: dict[str, Any], workload: dict[str, Any], notes: list[str]) -> None:
    """Lengthen the sequence by prompt tuning's virtual tokens (:func:`prompt_tokens`)."""
    lora = point.get("lora") or {}
    match = re.match(r"\s*([\d,]+) trainable", lora.get("source_text") or "")
    if lora.get("variant") != "prompt_tuning" or match is None:
        return
    virtual = prompt_tokens(int(match.group(1).replace(",", "")), point["hf_config"]["hidden_size"])
    if virtual is None:
        notes.append("prompt tuning: trainable count is not a whole number of virtual tokens; seq not lengthened")
        return
    workload["seq"] += virtual
    notes.append(f"prompt tuning: {virtual} virtual tokens prepended (peft_model.py): seq {workload['seq']}")


def _torchtitan_date(point: dict[str, Any]) -> str | None:
    text = f"{point.get('source') or ''} {point.get('software') or ''}"
    return next((date for version, date in _TORCHTITAN_DATES.items() if f"torchtitan {version}" in text), None)


def _torchtitan_pipeline(workload: dict[str, Any], date: str | None, notes: list[str]) -> None:
    """Split the local batch into pipeline micro-batches the way the point's torchtitan did."""
    pp = workload["parallel"]["pp"]
    if pp == 1:
        return
    if date is not None and date < _TORCHTITAN_MICROBATCH_SIZE and workload["batch"] % pp == 0:
        workload["grad_accum"] = pp
        workload["batch"] //= pp
        notes.append(f"torchtitan pipeline before 2025-04-07: local batch split into pp={pp} micro-batches")
        return
    workload["grad_accum"] = workload["batch"]
    workload["batch"] = 1
    notes.append("torchtitan pipeline: local batch split into micro-batches of 1 sample (microbatch_size default)")


def _torchtitan_version_fixes(point: dict[str, Any], workload: dict[str, Any], notes: list[str]) -> None:
    """Defaults of the torchtitan version a point ran, where they differ from today's profile."""
    date = _torchtitan_date(point)
    _torchtitan_pipeline(workload, date, notes)
    if workload["compile"] and date is not None and date < _TORCHTITAN_LOSS_COMPILED:
        workload["loss"] = "full"
        notes.append(f"torchtitan of {date} predates the compiled loss (2025-04-02): eager cross-entropy")
    if workload["parallel"]["shard"] in ("fsdp", "hsdp") and date is not None and date < _TORCHTITAN_SPLIT_UNITS:
        workload["fsdp_wrap"] = "root"
        notes.append(f"torchtitan of {date} predates its split FSDP units (2025-07-28): embedding and head in the root")


def _hf_fsdp_version(point: dict[str, Any], workload: dict[str, Any], notes: list[str]) -> None:
    """HF Trainer ran FSDP1 before transformers 5 (``fsdp_config`` version 2 is the default
    since): the embedding and head stay in the root unit. Every published HF point predates it."""
    software = (point.get("software") or "").lower()
    if workload["parallel"]["shard"] in ("fsdp", "hsdp") and "transformers 5" not in software:
        workload["fsdp_wrap"] = "root"
        notes.append("HF Trainer before transformers 5: FSDP1 (embedding and head in the root unit)")


_SOFTWARE = {
    "transformers": r"transformers\s+v?(\d+\.\d+(?:\.\d+)?)",
    "torch": r"(?:pytorch|torch)\s+v?(\d+\.\d+(?:\.\d+)?)",
}


def software_versions(point: dict[str, Any]) -> dict[str, str]:
    """Library versions a point's ``software`` text names (the workload's ``versions``)."""
    text = (point.get("software") or "").lower()
    found = {}
    for package, pattern in _SOFTWARE.items():
        match = re.search(pattern, text)
        if match:
            found[package] = match.group(1)
    return found


def _optimizer_impl(point: dict[str, Any]) -> str | None:
    """The AdamW implementation a point's optimizer text names, where it names one.

    ``adamw_torch`` (HF Trainer's default before transformers 4.55 / torch 2.8) and a plain
    ``torch.optim.AdamW`` both run the foreach implementation on CUDA (torch picks foreach
    when ``foreach`` and ``fused`` are left unset).
    """
    text = (point.get("optimizer_text") or "").lower()
    if point["optimizer"] != "adamw" or "fused" in text:
        return None
    if "adamw_torch" in text or "torch adamw" in text:
        return "foreach"
    return None


_ENGINE = {"hf_generate": "hf", "vllm": "vllm"}


def inference_workload(point: dict[str, Any]) -> Mapped:
    """The workload of one inference point. A figure without the KV cache (vLLM's own
    memory-profiling log) is compared at level ``non_kv``: weights + profile activation
    peak + non-torch memory, the three parts vLLM logs before sizing its pool."""
    level = LEVEL.get(point["measured_kind"], "device")
    engine = _ENGINE.get(point["framework"])
    if engine is None:
        return Mapped(workload=None, level=level, skip_reason=f"inference engine {point['framework']!r} has no profile")
    if not point.get("kv_cache_in_figure", True):
        level = "non_kv"
    parallel = point["parallel"]
    workload: dict[str, Any] = {
        "model": point["hf_config"],
        "mode": "infer",
        "engine": engine,
        "precision": _PRECISION.get(point["precision"], "bf16"),
        "batch": point["micro_batch"],
        "prompt": point["prompt_len"],
        "generate": point["gen_len"],
        "attention": point["attention"] if point["attention"] in ("flash", "sdpa", "eager", "efficient") else "auto",
        "allow_long_context": True,
        "parallel": {"gpus": parallel["gpus"], "tp": parallel["tp"] or 1, "pp": parallel["pp"] or 1},
    }
    if point.get("weight_quant"):
        workload["quant"] = point["weight_quant"]
    notes = []
    if engine == "vllm" and "max_num_batched_tokens" in " ".join(point.get("assumptions") or []):
        workload["max_num_batched_tokens"] = point["seq_len"]
        notes.append(f"vLLM profile over max_num_batched_tokens {point['seq_len']} (from the point's assumptions)")
    workload["versions"] = software_versions(point)
    return Mapped(workload=workload, level=level, notes=notes)


def point_workload(point: dict[str, Any]) -> Mapped:
    """The workload of one validation point."""
    if point["task"] == "infer":
        return inference_workload(point)
    level = LEVEL.get(point["measured_kind"], "device")
    notes: list[str] = []
    framework = _FRAMEWORK.get(point["framework"])
    if framework is None:
        return Mapped(workload=None, level=level, skip_reason=f"framework {point['framework']!r} has no profile")
    parallel = point["parallel"]
    flags = point["flags"]
    workload: dict[str, Any] = {
        "model": point["hf_config"],
        "framework": framework,
        "precision": _PRECISION.get(point["precision"], "bf16"),
        "optimizer": _OPTIMIZER.get(point["optimizer"] or "adamw", "adamw"),
        "batch": point["micro_batch"],
        "seq": point["seq_len"],
        "grad_accum": point["grad_accum"] or 1,
        "recompute": _RECOMPUTE.get(point["activation_checkpointing"], "none"),
        "attention": point["attention"] if point["attention"] in ("flash", "sdpa", "eager", "efficient") else "auto",
        "compile": bool(flags.get("compile")),
        "float8": bool(flags.get("float8")),
        "optimizer_in_backward": bool(flags.get("fused_optimizer_in_backward")),
        "packing": bool(flags.get("packing")),
        "allow_long_context": True,
        "parallel": {
            "gpus": parallel["gpus"],
            "shard": _SHARD.get(parallel["strategy"], "none"),
            "tp": parallel["tp"] or 1,
            "pp": parallel["pp"] or 1,
            "cp": parallel["cp"] or 1,
            "offload": _OFFLOAD.get(parallel.get("cpu_offload") or "none", "none"),
            "pp_schedule": _SCHEDULE.get((parallel.get("pp_schedule") or "1f1b").lower(), "1f1b"),
        },
    }
    if framework == "torchtitan":
        _torchtitan_version_fixes(point, workload, notes)
    if framework == "hf":
        _hf_fsdp_version(point, workload, notes)
    impl = _optimizer_impl(point)
    if impl:
        workload["optimizer_impl"] = impl
        notes.append(f"optimizer implementation {impl} (from: {point['optimizer_text'][:40]})")
    if point["precision"] == "nf4":
        workload["precision"] = "bf16"
    text = (point.get("precision_text") or "").lower()
    amp = "--bf16" in text or "autocast" in text or text.strip() == "bf16"
    if (
        point["framework"] == "hf_trainer"
        and point["precision"] == "bf16"
        and amp
        and workload["parallel"]["shard"] in ("fsdp", "hsdp")
    ):
        # TrainingArguments(bf16=True) is automatic mixed precision; under FSDP accelerate upcasts
        # bf16-loaded parameters to fp32 ("FSDP upcast of low precision parameters").
        workload["precision"] = "mixed-bf16"
        notes.append("HF Trainer --bf16 with FSDP: accelerate keeps fp32 parameters (mixed precision)")
    if flags.get("chunked_ce") and not flags.get("liger"):
        workload["loss"] = "chunked"
    if flags.get("liger") and (point.get("hf_config") or {}).get("model_type") in LIGER_PATCHES:
        workload["kernels"] = "liger"  # its norms, gated MLP and RoPE; loss auto: its fused linear cross-entropy
    elif flags.get("liger"):
        workload["loss"] = "fused-linear"
        notes.append(
            "Liger: only its fused linear cross-entropy is expressible for this family (kernels: liger is not)"
        )
    if "memory_budget" in (point.get("activation_checkpointing_text") or ""):
        notes.append(f"torch.compile activation memory budget expressed as recompute '{workload['recompute']}'")
    if flags.get("activation_offload"):
        workload["recompute"] = "offload"
    if (
        workload["parallel"]["shard"] == "fsdp"
        and parallel.get("shard_degree")
        and parallel["shard_degree"] < parallel["dp"]
    ):
        workload["parallel"]["shard"] = "hsdp"
        workload["parallel"]["shard_degree"] = parallel["shard_degree"]
    reason = _method(point, workload, notes)
    if reason:
        return Mapped(workload=None, level=level, skip_reason=reason)
    if point["framework"] == "forgather":
        notes.append("forgather (HF-style trainer and modules) estimated with the hf profile")
    workload["versions"] = software_versions(point)
    return Mapped(workload=workload, level=level, notes=notes)
