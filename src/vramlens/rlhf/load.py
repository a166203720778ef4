"""``load_rlhf``: an :class:`RlhfSetup` from a YAML/JSON file or a dict, with overrides.

The file format (every key optional except ``algo``, ``actor`` and ``gpu``)::

    algo: ppo                 # ppo | grpo | dpo | rloo | online-dpo
    gpu: h100-80gb
    gpus: 8
    tp: 8                     # default tensor parallelism of every model and the rollout
    shard: none               # default sharding of every model (none | zero3 | fsdp | ...)
    cpu_offload: none         # actor/critic ZeRO-Offload while training: none | optimizer | optimizer+params
    actor: llama-3.1-70b      # or a mapping: {model, precision, method, lora_rank, quant,
    critic: ...               #   optimizer, recompute, tp, shard, cpu_offload, placement, gpus,
                              #   from_actor_base}
    reward: ...               # none/null: rule-based reward (no model)
    reference: ...            # none/null: no reference model
    rollout: {engine: vllm, gpu_memory_utilization: 0.5, tp: 8, placement: offload}
    group_size: 8             # grpo/rloo responses per prompt
    prompt: 1024
    response: 1024
    rollout_batch: 32         # prompts per step
    micro_batch: 4            # sequences per GPU per forward/backward
    pcie_gbps: 25
    precomputed_ref_logprobs: false
    offload: [reference, reward]   # shorthand for placement: offload
    separate: {reward: 2}          # shorthand for placement: separate with its GPU count

Overrides (the CLI's flags) are merged over the file; a role given as a name in the
overrides replaces only that role's ``model``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vramlens._untrusted import as_text, brief
from vramlens.errors import InputError
from vramlens.rlhf.setup import ROLES, Algo, ModelRole, Placement, RlhfSetup, RolloutSetup
from vramlens.workload.load import read_workload_file
from vramlens.workload.options import Engine

__all__ = ["load_rlhf"]

_TOP = (
    "algo", "gpu", "gpus", "tp", "shard", "cpu_offload", "actor", "critic", "reward", "reference", "rollout", "group_size",
    "prompt", "response", "rollout_batch", "micro_batch", "pcie_gbps", "precomputed_ref_logprobs", "offload",
    "colocate", "separate",
)  # fmt: skip
_ROLE_KEYS = (
    "model", "precision", "method", "lora_rank", "quant", "optimizer", "recompute", "tp", "shard", "cpu_offload",
    "placement", "gpus", "from_actor_base",
)  # fmt: skip
_ROLLOUT_KEYS = ("engine", "gpu_memory_utilization", "tp", "placement", "gpus", "kv_dtype", "max_num_seqs")
#: Responses per prompt when ``group_size`` is not given (TRL's defaults: GRPOConfig
#: num_generations=8, RLOOConfig rloo_k=2; online DPO samples a pair).
_GROUP_DEFAULT = {Algo.PPO: 1, Algo.GRPO: 8, Algo.DPO: 1, Algo.RLOO: 2, Algo.ONLINE_DPO: 2}
_NONE = (None, False, "none", "null", "")


def _unknown(where: str, keys: Mapping[str, Any], accepted: tuple[str, ...]) -> None:
    for key in keys:
        if key not in accepted:
            raise InputError(f"{where}{as_text(key, 80)}: unknown key; accepted: {', '.join(accepted)}")


def _role_block(name: str, value: Any) -> dict[str, Any] | None:
    if value in _NONE:
        return None
    if isinstance(value, str | os.PathLike):
        return {"model": str(value)}
    if not isinstance(value, Mapping):
        raise InputError(f"{name}: {brief(value)} is not accepted (a model name, a mapping of model keys, or none)")
    block = {str(k).replace("-", "_"): v for k, v in value.items()}
    _unknown(f"{name}.", block, _ROLE_KEYS)
    return block


def _merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    data = dict(base)
    for key, value in overrides.items():
        key = str(key).replace("-", "_")
        old = data.get(key)
        if key in ROLES and value not in _NONE and old not in _NONE and old is not None:
            old_block = {"model": old} if isinstance(old, str) else old
            new_block = {"model": value} if isinstance(value, str) else value
            if isinstance(old_block, Mapping) and isinstance(new_block, Mapping):
                data[key] = {**old_block, **new_block}
                continue
            data[key] = value
        else:
            data[key] = value
    return data


def _read(source: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(source, Mapping):
        return {str(k).replace("-", "_"): v for k, v in source.items()}
    if not Path(source).is_file():
        raise InputError(f"config: {source} is not a file (a YAML or JSON RLHF setup)")
    return {str(k).replace("-", "_"): v for k, v in read_workload_file(source).items()}


def _placements(data: Mapping[str, Any], present: set[str]) -> dict[str, tuple[Placement, int | None]]:
    """Role -> (placement, gpus) from the ``offload`` and ``separate`` shorthands."""
    chosen: dict[str, tuple[Placement, int | None]] = {}
    separate = data.get("separate") or {}
    if not isinstance(separate, Mapping):
        raise InputError(f"separate: {brief(separate)} is not accepted (a mapping role: gpus, e.g. reward=2)")
    listed = [(where, role, None) for where in ("colocate", "offload") for role in _roles(where, data.get(where))]
    for where, role, gpus in [*listed, *(("separate", r, g) for r, g in separate.items())]:
        if role not in present:
            raise InputError(
                f"{where}: {brief(role)} is not a role of this step (accepted: {', '.join(sorted(present))})"
            )
        if role in chosen:
            raise InputError(f"{where}: {role} is given two placements; accepted: one of colocate, offload, separate")
        if where == "separate":
            chosen[role] = (Placement.SEPARATE, _int(f"separate.{role}", gpus))
        else:
            chosen[role] = (Placement.COLOCATED if where == "colocate" else Placement.OFFLOAD, None)
    return chosen


def _roles(where: str, value: Any) -> list[str]:
    if value in _NONE:
        return []
    if isinstance(value, str):
        return [r.strip() for r in value.split(",") if r.strip()]
    if isinstance(value, list | tuple):
        return [str(r) for r in value]
    raise InputError(f"{where}: {brief(value)} is not accepted (a list of roles, e.g. reference,reward)")


def _int(where: str, value: Any) -> int:
    """A positive whole number, or its digits as text (its range is checked by the setup)."""
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() and len(value.strip()) <= 30:
        number = int(value.strip())
    if number is None or number <= 0:
        raise InputError(f"{where}: {brief(value)} is not accepted (a positive whole number)")
    return number


def _defaults(algo: Algo, data: dict[str, Any], notes: list[str]) -> dict[str, dict[str, Any] | None]:
    actor = _role_block("actor", data.get("actor"))
    if actor is None or "model" not in actor:
        raise InputError("actor: required; give a catalog name or a mapping with model")
    blocks: dict[str, dict[str, Any] | None] = {"actor": actor}
    lora_actor = actor.get("method", "full") in ("lora", "qlora")
    wanted = {
        "critic": algo is Algo.PPO,
        "reward": algo in (Algo.PPO, Algo.RLOO, Algo.ONLINE_DPO),
        "reference": not data.get("precomputed_ref_logprobs"),
    }
    for role in ("critic", "reward", "reference"):
        if role in data:
            block = _role_block(role, data[role])
            if block is not None and "model" not in block:
                block["model"] = actor["model"]
                notes.append(f"{role}: no model given, so the actor's model ({actor['model']})")
            blocks[role] = block
            continue
        if not wanted[role]:
            blocks[role] = None
            if role == "reward" and algo is Algo.GRPO:
                notes.append("reward: none given, so a rule-based (function) reward with no model")
            continue
        if role == "reference" and lora_actor:
            blocks[role] = {"model": actor["model"], "from_actor_base": True}
            notes.append("reference: the actor's LoRA base with adapters disabled (no weights of its own)")
        else:
            blocks[role] = {"model": actor["model"]}
            notes.append(f"{role}: none given, so the actor's model ({actor['model']})")
    return blocks


def _build_role(role: str, block: dict[str, Any], data: Mapping[str, Any], place: Any) -> ModelRole:
    kwargs = dict(block)
    explicit_tp = "tp" in kwargs
    kwargs.setdefault("tp", data.get("tp", 1))
    kwargs.setdefault("shard", data.get("shard", "none"))
    if role in ("actor", "critic"):
        kwargs.setdefault("cpu_offload", data.get("cpu_offload", "none"))
    else:
        kwargs.setdefault("precision", "bf16")
    if place is not None:
        kwargs["placement"], kwargs["gpus"] = place
    for key in ("tp", "lora_rank", "gpus"):
        if kwargs.get(key) is not None:
            kwargs[key] = _int(f"{role}.{key}", kwargs[key])
    if "placement" in kwargs:
        kwargs["placement"] = _placement(f"{role}.placement", kwargs["placement"])
    _group_tp(kwargs, explicit_tp)
    return ModelRole(role=role, **kwargs)


def _group_tp(kwargs: dict[str, Any], explicit: bool) -> None:
    """A separate group smaller than the default tp gets the largest tp that divides it."""
    if not explicit and kwargs.get("placement") is Placement.SEPARATE and kwargs.get("gpus"):
        kwargs["tp"] = math.gcd(kwargs["tp"], kwargs["gpus"])


def _placement(where: str, value: Any) -> Placement:
    accepted = [p.value for p in Placement]
    if value not in accepted:
        raise InputError(f"{where}: {brief(value)} is not one of {', '.join(accepted)}")
    return Placement(value)


def _build_rollout(data: Mapping[str, Any], place: Any, notes: list[str]) -> RolloutSetup:
    raw = data.get("rollout") or {}
    if not isinstance(raw, Mapping):
        raise InputError(f"rollout: {brief(raw)} is not accepted (a mapping of {', '.join(_ROLLOUT_KEYS)})")
    kwargs = {str(k).replace("-", "_"): v for k, v in raw.items()}
    _unknown("rollout.", kwargs, _ROLLOUT_KEYS)
    explicit_tp = "tp" in kwargs
    kwargs.setdefault("tp", data.get("tp", 1))
    kwargs["tp"] = _int("rollout.tp", kwargs["tp"])
    engine = kwargs.get("engine", Engine.HF.value)
    if place is not None:
        kwargs["placement"], kwargs["gpus"] = place
    elif "placement" not in kwargs and engine == Engine.VLLM:
        kwargs["placement"] = Placement.OFFLOAD
        notes.append("rollout: vllm sleeps between generations (weights to CPU, KV pool freed), as verl does")
    if "placement" in kwargs:
        kwargs["placement"] = _placement("rollout.placement", kwargs["placement"])
    if kwargs.get("gpus") is not None:
        kwargs["gpus"] = _int("rollout.gpus", kwargs["gpus"])
    _group_tp(kwargs, explicit_tp)
    return RolloutSetup(**kwargs)


def load_rlhf(source: str | os.PathLike[str] | Mapping[str, Any], **overrides: Any) -> RlhfSetup:
    """A validated :class:`RlhfSetup` from a YAML/JSON path or a dict; ``overrides`` win."""
    data = _merge(_read(source), overrides)
    _unknown("", data, _TOP)
    algo_name = data.get("algo")
    if algo_name not in [a.value for a in Algo]:
        raise InputError(f"algo: {brief(algo_name)} is not one of {', '.join(a.value for a in Algo)}")
    algo = Algo(algo_name)
    if not data.get("gpu"):
        raise InputError("gpu: required; a GPU from the hardware table (h100-80gb, a100-80gb, ...) or a size")
    notes: list[str] = []
    blocks = _defaults(algo, data, notes)
    present = {role for role, block in blocks.items() if block is not None}
    if algo is not Algo.DPO:
        present.add("rollout")
    place = _placements(data, present)
    models = {role: _build_role(role, b, data, place.get(role)) for role, b in blocks.items() if b is not None}
    group_size = data["group_size"] if data.get("group_size") is not None else _GROUP_DEFAULT[algo]
    if "group_size" not in data and algo in (Algo.GRPO, Algo.RLOO):
        notes.append(f"group_size: {group_size} responses per prompt ({algo.value} default in TRL)")
    scalars = {k: data[k] for k in ("prompt", "response", "rollout_batch", "micro_batch", "pcie_gbps") if k in data}
    for key in ("prompt", "response", "rollout_batch", "micro_batch"):
        if key in scalars:
            scalars[key] = _int(key, scalars[key])
    return RlhfSetup(
        algo=algo,
        gpu=str(data["gpu"]),
        gpus=_int("gpus", data.get("gpus", 1)),
        actor=models["actor"],
        critic=models.get("critic"),
        reward=models.get("reward"),
        reference=models.get("reference"),
        rollout=_build_rollout(data, place.get("rollout"), notes),
        precomputed_ref_logprobs=bool(data.get("precomputed_ref_logprobs", False)),
        group_size=_int("group_size", group_size),
        assumptions=tuple(notes),
        **scalars,
    )
