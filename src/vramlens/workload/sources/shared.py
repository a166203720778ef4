"""Pieces several formats share: where a source file lives (to read the files it names), HF/
accelerate FSDP settings, and a DeepSpeed config referenced from another config."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from vramlens._files import read_small_text
from vramlens.errors import InputError
from vramlens.workload.sources._mapping import MappingBuilder, SourceNote
from vramlens.workload.sources._text import environment, parse_document, truthy

__all__ = [
    "MAX_SOURCE_BYTES",
    "ReadContext",
    "map_environment",
    "map_fsdp_words",
    "merge_deepspeed",
    "read_reference",
]

MAX_SOURCE_BYTES: Final = 1 << 20

#: FSDP1 ``sharding_strategy`` (names and accelerate's numbers) -> workload shard.
_STRATEGIES: Final = {
    "full_shard": "fsdp", "1": "fsdp",
    "shard_grad_op": "zero2", "2": "zero2",
    "no_shard": "ddp", "3": "ddp",
    "hybrid_shard": "hsdp", "4": "hsdp",
    "hybrid_shard_zero2": "hsdp", "5": "hsdp",
}  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class ReadContext:
    """Where a source came from: its display name, and its folder for the files it names
    (None for uploads, which cannot name files)."""

    origin: str
    directory: Path | None = None
    depth: int = 0


def read_reference(ctx: ReadContext, value: str) -> tuple[Path, str] | None:
    """The text of a file a config names (relative to the config's folder), or None when it is
    not there (or the source was an upload, or references nest more than one level)."""
    if ctx.directory is None or ctx.depth >= 1:
        return None
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = ctx.directory / path
    if not path.is_file():
        return None
    return read_small_text(path, limit=MAX_SOURCE_BYTES, error=InputError, what="a config file")


def _fsdp_key(name: str) -> str:
    return name[len("fsdp_") :] if name.startswith("fsdp_") else name


def map_fsdp_words(
    out: MappingBuilder, key: str, words: Sequence[str], config: Mapping[str, Any], *, version: Any = None
) -> None:
    """HF ``fsdp`` words (``full_shard auto_wrap offload``) plus an ``fsdp_config`` mapping (keys with
    or without the ``fsdp_`` prefix, as transformers and accelerate write them) -> sharding keys."""
    settings = {_fsdp_key(str(k)): v for k, v in config.items()}
    lowered = [w.strip().lower() for w in words if w.strip()]
    strategy = next((w for w in lowered if w in _STRATEGIES), None)
    raw_strategy = settings.get("sharding_strategy")
    if strategy is None and raw_strategy is not None:
        strategy = str(raw_strategy).strip().lower()
        if strategy not in _STRATEGIES:
            raise out.fail("fsdp_sharding_strategy", f"unknown value {raw_strategy!r}; expected FULL_SHARD, "
                           "SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2")  # fmt: skip
    reshard = settings.get("reshard_after_forward")
    if strategy is None and reshard is not None and not truthy(reshard):
        strategy = "shard_grad_op"
    strategy = strategy or "full_shard"
    shard = _STRATEGIES[strategy]
    why = {
        "zero2": "parameters stay gathered from forward to backward; gradients and states sharded, as ZeRO-2",
        "hsdp": "sharded within a node, replicated across nodes",
    }.get(shard, "")
    out.set("parallel.shard", shard, key, shown=strategy, why=why)
    if strategy in ("hybrid_shard_zero2", "5"):
        out.not_modelled(key, strategy, "ZeRO-2 inside each node is read as hybrid full sharding")
    if shard == "hsdp" and not out.has("parallel.shard_degree"):
        out.note(
            "hybrid sharding: the GPUs per node are not in the config; pass --shard-degree N", "parallel.shard_degree"
        )
    if "offload" in lowered or truthy(settings.get("offload_params")) or truthy(settings.get("cpu_offload")):
        out.set("parallel.offload", "optimizer+params", f"{key} offload", shown=True,
                why="FSDP CPUOffload: parameters, gradients and the optimizer step on the CPU")  # fmt: skip
    raw_version = settings.get("version", version)
    if raw_version is not None and shard in ("fsdp", "hsdp"):
        text = str(raw_version).strip()
        if text not in ("1", "2"):
            raise out.fail("fsdp_version", f"must be 1 or 2, got {raw_version!r}")
        out.set("fsdp_wrap", "root" if text == "1" else "split", "fsdp_version", shown=raw_version)
    if truthy(settings.get("activation_checkpointing")):
        out.set("recompute", "full", "fsdp_activation_checkpointing", shown=True)
    if truthy(settings.get("forward_prefetch")):
        out.not_modelled("fsdp_forward_prefetch", True, "one more layer gathered during forward")
    policy = str(settings.get("auto_wrap_policy") or "").upper()
    if policy in ("SIZE_BASED_WRAP", "NO_WRAP"):
        out.not_modelled("fsdp_auto_wrap_policy", policy, "FSDP units other than one per decoder layer")


def merge_deepspeed(out: MappingBuilder, key: str, value: Any, ctx: ReadContext) -> None:
    """Read a DeepSpeed config named by ``key`` (a path beside the source, or an inline mapping)
    and add what it sets that ``out`` has not set yet (the outer config's explicit values win,
    as the HF integration fills the DeepSpeed config's ``auto`` values from them)."""
    from vramlens.workload.sources import deepspeed

    if isinstance(value, Mapping):
        data: Any = value
        origin = f"{key} (inline)"
    else:
        found = read_reference(ctx, str(value))
        if found is None:
            out.not_modelled(key, value, "DeepSpeed config not found beside the config; pass --shard and --offload")
            return
        path, text = found
        data = parse_document(text, str(path), json_first=path.suffix.lower() == ".json")
        origin = str(value)
    if not isinstance(data, Mapping):
        raise out.fail(key, f"expected a DeepSpeed config mapping, got {type(data).__name__}")
    inner = deepspeed.read(data, ReadContext(origin=origin, directory=ctx.directory, depth=ctx.depth + 1))
    for name, item in inner.keys.items():
        if isinstance(item, dict):
            block = out.keys.setdefault(name, {})
            for sub, sub_value in item.items():
                block.setdefault(sub, sub_value)
        else:
            out.keys.setdefault(name, item)
    if "framework" in inner.keys:
        out.keys["framework"] = inner.keys["framework"]  # the DeepSpeed engine holds the weights, not the Trainer
    out.notes.append(SourceNote(text=f"{out.format} {key}: read {origin} as a DeepSpeed config", target=None))
    out.notes.extend(inner.notes)
    out.unmodelled.extend(inner.unmodelled)


#: The environment variables that change GPU memory and the workload key each sets. A command line
#: carries no library versions (workload key ``versions``): give them with ``--versions``.
_ENVIRONMENT: Final = {"PYTORCH_CUDA_ALLOC_CONF": "alloc_conf", "PYTORCH_ALLOC_CONF": "alloc_conf"}
#: Environment variables known to matter for memory that no workload key holds.
_ENVIRONMENT_UNMODELLED: Final = frozenset({"PYTORCH_HIP_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING"})


def map_environment(out: MappingBuilder, tokens: list[str]) -> None:
    """Set ``alloc_conf`` from ``PYTORCH_CUDA_ALLOC_CONF`` (or torch 2.9's ``PYTORCH_ALLOC_CONF``)
    assigned on the command line; list the other memory-relevant variables as not modelled."""
    for name, value in environment(tokens).items():
        if name in _ENVIRONMENT:
            out.set(_ENVIRONMENT[name], value, name, why="the run's caching allocator settings")
        elif name in _ENVIRONMENT_UNMODELLED:
            out.not_modelled(name, value)
