"""Build a :class:`Workload` from a dict, a YAML/JSON file, or CLI flags - strictly.

Unknown keys and values are one-line errors that name the key, suggest the
closest accepted key, and list what is accepted. Files are read with
``yaml.safe_load`` / ``json`` (no code execution). Token counts (``seq``,
``prompt``, ``generate``, ``context``) also accept ``8k`` = 8192.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import math
import os
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, Final

from vramlens._files import read_small_text
from vramlens.errors import InputError
from vramlens.workload.options import (
    AttentionImpl,
    Engine,
    Framework,
    FsdpWrap,
    KvDtype,
    LossImpl,
    Method,
    Mode,
    Offload,
    OptimizerImpl,
    OptimizerName,
    PipelineSchedule,
    Precision,
    Quant,
    Recompute,
    Shard,
)
from vramlens.workload.spec import ALL_LINEAR, LoraConfig, Parallelism, Workload

__all__ = ["load_workload", "read_workload_file", "workload_to_dict"]

Converter = Callable[[str, Any], Any]
MAX_WORKLOAD_FILE_BYTES: Final = 1 << 20


def _enum(cls: type[Enum]) -> Converter:
    accepted = ", ".join(str(member.value) for member in cls)

    def convert(key: str, value: Any) -> Any:
        if isinstance(value, cls):
            return value
        text = str(value).strip().lower() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
        for member in cls:
            if member.value == text:
                return member
        raise InputError(f"{key}: unknown value {value!r}; expected one of {accepted}")

    return convert


def _integer(minimum: int, *, tokens: bool = False) -> Converter:
    def convert(key: str, value: Any) -> int:
        if isinstance(value, str):
            text = value.strip().lower().replace("_", "")
            scale = 1
            if tokens and text.endswith("k"):
                text, scale = text[:-1], 1024
            if text.isascii() and text.isdigit():
                value = int(text) * scale
        if isinstance(value, bool) or not isinstance(value, int):
            example = " (or e.g. '8k' = 8192)" if tokens else ""
            raise InputError(f"{key}: must be an integer >= {minimum}{example}, got {value!r}")
        if value < minimum:
            raise InputError(f"{key}: must be an integer >= {minimum}, got {value}")
        return value

    return convert


def _number(key: str, value: Any) -> float:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{key}: must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise InputError(f"{key}: must be a finite number, got {_short(value)}")
    return number


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...{text[-10:]}"


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    raise InputError(f"{key}: must be true or false, got {value!r}")


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{key}: must be a non-empty string, got {value!r}")
    return value.strip()


def _optional(convert: Converter) -> Converter:
    return lambda key, value: None if value is None or value == "null" else convert(key, value)


def _names(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise InputError(f"{key}: must be a list of module names, got {value!r}")
    return tuple(v.strip() for v in value)


def _targets(key: str, value: Any) -> str | tuple[str, ...]:
    if isinstance(value, str) and value.strip().lower() == ALL_LINEAR:
        return ALL_LINEAR
    names = _names(key, value)
    if not names:
        raise InputError(f"{key}: must be 'all-linear' or a non-empty list of module names")
    return names


def _gpu(key: str, value: Any) -> str:
    """A GPU name or size, checked against the hardware table now (kept as written)."""
    from vramlens.hardware import resolve_gpu

    text = _text(key, value)
    resolve_gpu(text, field_name=key)
    return text


def _alloc_conf(key: str, value: Any) -> str:
    """A ``PYTORCH_CUDA_ALLOC_CONF`` string, parsed now as PyTorch parses it (kept as written)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(
            f"{key}: must be a PYTORCH_CUDA_ALLOC_CONF string such as 'expandable_segments:True', got {value!r}"
        )
    from vramlens.allocator import AllocatorSettings

    text = value.strip()
    try:
        AllocatorSettings.from_conf(text)
    except ValueError as error:
        raise InputError(f"{key}: {str(error).removeprefix('allocator config: ')}") from None
    return text


def _versions(key: str, value: Any) -> tuple[tuple[str, str], ...]:
    """Library versions: a mapping (or ``"transformers=4.35,vllm=0.6"``) of known packages to
    quoted release numbers; sorted pairs."""
    from vramlens.estimate.versions import PACKAGES, parse_version

    if value is None:
        return ()
    if isinstance(value, tuple) and all(isinstance(pair, tuple) and len(pair) == 2 for pair in value):
        value = dict(value)
    if isinstance(value, str):
        pairs = [part.split("=", 1) for part in value.split(",") if part.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise InputError(
                f"{key}: expected package=version pairs such as 'transformers=4.35,vllm=0.6', got {value!r}"
            )
        value = {name.strip(): version.strip() for name, version in pairs}
    if not isinstance(value, Mapping):
        raise InputError(
            f"{key}: expected a mapping of package to version, e.g. {{transformers: '4.35'}}, got {value!r}"
        )
    found = {}
    for package, version in value.items():
        if package not in PACKAGES:
            raise InputError(f"{key}: unknown package {package!r}; accepted: {', '.join(PACKAGES)}")
        if not isinstance(version, str) or parse_version(version) is None:
            raise InputError(
                f"{key}.{package}: expected a quoted release number such as '4.46' "
                f"(a YAML number loses trailing zeros), got {version!r}"
            )
        found[package] = version.strip()
    return tuple(sorted(found.items()))


def _model(key: str, value: Any) -> Any:
    from vramlens.model.spec import ModelSpec

    return value if isinstance(value, ModelSpec) else _text(key, value)


LORA_KEYS: Final[dict[str, Converter]] = {
    "rank": _integer(1),
    "alpha": _number,
    "dropout": _number,
    "targets": _targets,
    "modules_to_save": _names,
}
PARALLEL_KEYS: Final[dict[str, Converter]] = {
    "gpus": _integer(1),
    "shard": _enum(Shard),
    "shard_degree": _optional(_integer(1)),
    "tp": _integer(1),
    "pp": _integer(1),
    "pp_schedule": _enum(PipelineSchedule),
    "cp": _integer(1),
    "ep": _integer(1),
    "offload": _enum(Offload),
}
TOP_KEYS: Final[dict[str, Converter]] = {
    "model": _model,
    "mode": _enum(Mode),
    "gpu": _optional(_gpu),
    "framework": _enum(Framework),
    "method": _enum(Method),
    "precision": _enum(Precision),
    "quant": _enum(Quant),
    "float8": _flag,
    "optimizer": _enum(OptimizerName),
    "optimizer_impl": _enum(OptimizerImpl),
    "optimizer_in_backward": _flag,
    "batch": _integer(1),
    "seq": _integer(1, tokens=True),
    "grad_accum": _integer(1),
    "packing": _flag,
    "recompute": _enum(Recompute),
    "recompute_every": _integer(1),
    "attention": _enum(AttentionImpl),
    "loss": _enum(LossImpl),
    "compile": _flag,
    "moe_capacity_factor": _optional(_number),
    "fsdp_wrap": _enum(FsdpWrap),
    "prompt": _integer(1, tokens=True),
    "generate": _integer(0, tokens=True),
    "context": _optional(_integer(1, tokens=True)),
    "kv_dtype": _enum(KvDtype),
    "engine": _enum(Engine),
    "gpu_memory_utilization": _number,
    "max_num_seqs": _integer(1),
    "block_size": _integer(1),
    "max_num_batched_tokens": _optional(_integer(1, tokens=True)),
    "allow_long_context": _flag,
    "alloc_conf": _alloc_conf,
    "versions": _versions,
}
_NESTED: Final = {"lora": LORA_KEYS, "parallel": PARALLEL_KEYS}


def _unknown(where: str, key: str, accepted: list[str]) -> InputError:
    close = difflib.get_close_matches(key, accepted, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return InputError(f"{where}: unknown key {key!r}{hint}; accepted keys: {', '.join(accepted)}")


def _convert_block(where: str, raw: Any, table: Mapping[str, Converter]) -> dict[str, Any]:
    if isinstance(raw, (LoraConfig, Parallelism)):
        return {f.name: getattr(raw, f.name) for f in dataclasses.fields(raw)}
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: expected a mapping of keys, got {type(raw).__name__}")
    converted = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in table:
            raise _unknown(where, str(key), list(table))
        converted[name] = table[name](f"{where}.{name}", value)
    return converted


def _merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        name = str(key).replace("-", "_")
        if name in _NESTED and isinstance(value, Mapping) and isinstance(merged.get(name), Mapping):
            merged[name] = {**merged[name], **value}
        else:
            merged[name] = value
    return merged


def read_workload_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or JSON workload file safely into a dict."""
    file, text = read_small_text(path, limit=MAX_WORKLOAD_FILE_BYTES, error=InputError, what="a workload file")
    try:
        if file.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{file}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except Exception as exc:  # yaml.YAMLError and its subclasses
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{file}: invalid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise InputError(f"{file}: expected a mapping of workload keys at the top level, got {type(data).__name__}")
    return data


def load_workload(
    source: Workload | Mapping[str, Any] | str | os.PathLike[str],
    overrides: Mapping[str, Any] | None = None,
) -> Workload:
    """A validated :class:`Workload` from a Workload, a dict, or a YAML/JSON path; ``overrides`` win."""
    if isinstance(source, Workload) and not overrides:
        return source  # already validated when it was built
    if isinstance(source, Workload):
        base = workload_to_dict(source, keep_model_object=True)
    elif isinstance(source, Mapping):
        base = dict(source)
    else:
        base = read_workload_file(source)
    data = _merge(base, overrides or {})
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name in _NESTED:
            kwargs[name] = _convert_block(name, value, _NESTED[name])
        elif name in TOP_KEYS:
            kwargs[name] = TOP_KEYS[name](name, value)
        else:
            raise _unknown("workload", str(key), [*TOP_KEYS, *_NESTED])
    if "model" not in kwargs:
        raise InputError("model: required; give a catalog name, a config.json or model directory, or a cached HF id")
    kwargs["lora"] = LoraConfig(**kwargs.get("lora", {}))
    kwargs["parallel"] = Parallelism(**kwargs.get("parallel", {}))
    return Workload(**kwargs)


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def workload_to_dict(workload: Workload, *, keep_model_object: bool = False) -> dict[str, Any]:
    """The normalized workload: every key with its value or default, JSON-safe."""
    result: dict[str, Any] = {}
    for f in dataclasses.fields(workload):
        value = getattr(workload, f.name)
        if f.name == "model" and not keep_model_object and not isinstance(value, str):
            value = value.name
        elif f.name == "versions":
            value = dict(value)
        elif isinstance(value, (LoraConfig, Parallelism)):
            value = {g.name: _plain(getattr(value, g.name)) for g in dataclasses.fields(value)}
        else:
            value = _plain(value)
        result[f.name] = value
    return result
