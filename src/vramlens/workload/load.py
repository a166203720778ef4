"""Build a :class:`Workload` from a dict, a YAML/JSON file, or CLI flags - strictly.

Unknown keys and values are one-line errors that name the key, suggest the
closest accepted key, and list what is accepted. Files are read with
``yaml.safe_load`` / ``json`` (no code execution). Token counts (``seq``,
``prompt``, ``generate``, ``context``) also accept ``8k`` = 8192.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any, Final

from vramlens._files import LIMITS, read_regular
from vramlens._untrusted import abridge, brief, load_json, load_yaml
from vramlens.errors import InputError
from vramlens.workload._strings import alloc_conf, text, versions
from vramlens.workload.keys import Key, Kind, keys_of
from vramlens.workload.ranges import RANGES, check_range
from vramlens.workload.spec import ALL_LINEAR, LoraConfig, Parallelism, Workload

__all__ = ["load_workload", "read_workload_file", "workload_to_dict"]

Converter = Callable[[str, Any], Any]
MAX_WORKLOAD_FILE_BYTES: Final = LIMITS["workload"].limit


def _enum(cls: type[Enum]) -> Converter:
    accepted = ", ".join(str(member.value) for member in cls)

    def convert(key: str, value: Any) -> Any:
        if isinstance(value, cls):
            return value
        text = None
        if isinstance(value, str) and len(value) <= 100:
            text = value.strip().lower()
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**64:
            text = str(value)
        for member in cls:
            if member.value == text:
                return member
        raise InputError(f"{key}: unknown value {brief(value)}; expected one of {accepted}")

    return convert


#: Digits accepted in an integer written as text (2**64 has 20; more is never a count).
_MAX_DIGITS: Final = 30


def _integer(table_key: str, *, tokens: bool = False) -> Converter:
    """An integer key (``8k`` = 8192 for token counts), within the range of ``table_key`` in
    :data:`RANGES` (the converter is also called with other names, e.g. a sweep's ``--seq``)."""

    def convert(key: str, value: Any) -> int:
        if isinstance(value, str):
            text = value.strip().lower().replace("_", "")
            scale = 1
            if tokens and text.endswith("k"):
                text, scale = text[:-1], 1024
            if text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS:
                value = int(text) * scale
        if isinstance(value, bool) or not isinstance(value, int):
            example = " (or e.g. '8k' = 8192)" if tokens else ""
            raise InputError(f"{key}: must be an integer >= {int(RANGES[table_key].low)}{example}, got {brief(value)}")
        check_range(key, value, table_key=table_key)
        return value

    return convert


def _real(table_key: str) -> Converter:
    """A real-valued key: finite, within the range of ``table_key`` in :data:`RANGES`."""
    return lambda key, value: _number(key, value, table_key)


def _number(key: str, value: Any, table_key: str | None = None) -> float:
    """A finite number (within the range of ``table_key`` in :data:`RANGES` when given)."""
    if isinstance(value, str) and len(value) <= 100:
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{key}: must be a number, got {brief(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise InputError(f"{key}: must be a finite number, got {brief(value)}")
    if table_key is not None:
        check_range(key, number, kind="a number", table_key=table_key)
    return number


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    raise InputError(f"{key}: must be true or false, got {brief(value)}")


def _optional(convert: Converter) -> Converter:
    return lambda key, value: None if value is None or value == "null" else convert(key, value)


def _names(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise InputError(f"{key}: must be a list of module names, got {brief(value)}")
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

    name = text(key, value)
    resolve_gpu(name, field_name=key)
    return name


def _model(key: str, value: Any) -> Any:
    from vramlens.model.spec import ModelSpec

    return value if isinstance(value, ModelSpec) else text(key, value)


def _converter(key: Key) -> Converter:
    """The converter of one declared key (:data:`vramlens.workload.keys.KEYS`): its kind decides."""
    simple: dict[Kind, Converter] = {
        Kind.TEXT: text,
        Kind.MODEL: _model,
        Kind.GPU: _gpu,
        Kind.SWITCH: _flag,
        Kind.NAMES: _names,
        Kind.TARGETS: _targets,
        Kind.ALLOC_CONF: alloc_conf,
        Kind.VERSIONS: versions,
    }
    if key.values is not None:
        convert = _enum(key.values)
    elif key.kind in (Kind.INT, Kind.TOKENS):
        convert = _integer(key.path, tokens=key.kind is Kind.TOKENS)
    elif key.kind is Kind.REAL:
        convert = _real(key.path)
    else:
        convert = simple[key.kind]
    return _optional(convert) if key.nullable else convert


#: Key name -> converter, per block, generated from the declaration of every key.
TOP_KEYS: Final[dict[str, Converter]] = {key.name: _converter(key) for key in keys_of("")}
LORA_KEYS: Final[dict[str, Converter]] = {key.name: _converter(key) for key in keys_of("lora")}
PARALLEL_KEYS: Final[dict[str, Converter]] = {key.name: _converter(key) for key in keys_of("parallel")}
_NESTED: Final = {"lora": LORA_KEYS, "parallel": PARALLEL_KEYS}


def _unknown(where: str, key: Any, accepted: list[str]) -> InputError:
    text = key if isinstance(key, str) else brief(key)
    import difflib  # on a miss only (2 ms of a cold start)

    close = difflib.get_close_matches(text, accepted, n=1) if len(text) <= 100 else []
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return InputError(f"{where}: unknown key {abridge(repr(text), 80)}{hint}; accepted keys: {', '.join(accepted)}")


def _convert_block(where: str, raw: Any, table: Mapping[str, Converter]) -> dict[str, Any]:
    if isinstance(raw, (LoraConfig, Parallelism)):
        return {f.name: getattr(raw, f.name) for f in dataclasses.fields(raw)}
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: expected a mapping of keys, got {type(raw).__name__}")
    converted = {}
    for key, value in raw.items():
        name = key.replace("-", "_") if isinstance(key, str) else ""
        if name not in table:
            raise _unknown(where, key, list(table))
        converted[name] = table[name](f"{where}.{name}", value)
    return converted


def _merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` on top; a nested block (``lora``, ``parallel``) is merged key
    by key, and one that is not a mapping is refused here (it would otherwise be replaced)."""
    merged = {_key(key): value for key, value in base.items()}
    for key, value in overrides.items():
        name = _key(key)
        if name in _NESTED and isinstance(value, Mapping) and name in merged:
            if not isinstance(merged[name], Mapping):
                raise InputError(f"{name}: expected a mapping of keys, got {type(merged[name]).__name__}")
            merged[name] = {**merged[name], **value}
        else:
            merged[name] = value
    return merged


def _key(key: Any) -> Any:
    """A key with dashes as underscores (non-strings kept, for the unknown-key message)."""
    return key.replace("-", "_") if isinstance(key, str) else key


def read_workload_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or JSON workload file safely into a dict: a regular file
    of at most 1 MiB, parsed with :func:`vramlens._untrusted.load_json` / ``load_yaml`` (no code,
    bounded nesting and aliases)."""
    kind = LIMITS["workload"]
    file = Path(path)
    raw = read_regular(file, kind, InputError)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{file}: not UTF-8 text; expected {kind.what}") from None
    if file.suffix.lower() == ".json":
        data = load_json(text, name=str(file), what=kind.what)
    else:
        data = load_yaml(text, name=str(file))
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
        name = _key(key)
        if name in _NESTED:
            kwargs[name] = _convert_block(name, value, _NESTED[name])
        elif name in TOP_KEYS:
            kwargs[name] = TOP_KEYS[name](name, value)
        else:
            raise _unknown("workload", key, [*TOP_KEYS, *_NESTED])
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
