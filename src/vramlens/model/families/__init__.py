"""Registry of config parsers, one per ``model_type``.

A family module registers a parser with :func:`register`; adding a model
family means adding a module here (and a line in ``_FAMILY_MODULES``), never
an ``elif``. :func:`parse_config` dispatches on ``model_type``.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from vramlens.errors import ConfigError
from vramlens.model.config_reader import ConfigView
from vramlens.model.spec import ModelSpec

__all__ = ["Parser", "parse_config", "register", "supported_model_types"]

Parser = Callable[[ConfigView], ModelSpec]

_FAMILY_MODULES = ("llama", "gemma", "phi", "gpt", "deepseek")
_PARSERS: dict[str, Parser] = {}
_FALLBACK = "llama"
#: Keys that make an unknown model_type readable as a Llama-style decoder.
_LLAMA_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
_loaded = False


def register(*model_types: str) -> Callable[[Parser], Parser]:
    """Decorator: register ``parser`` for each of ``model_types`` (duplicates are an error)."""

    def decorate(parser: Parser) -> Parser:
        for model_type in model_types:
            if model_type in _PARSERS:
                raise RuntimeError(f"model_type {model_type!r} registered twice")
            _PARSERS[model_type] = parser
        return parser

    return decorate


def _load() -> None:
    global _loaded
    if not _loaded:
        for module in _FAMILY_MODULES:
            importlib.import_module(f"{__name__}.{module}")
        _loaded = True


def supported_model_types() -> tuple[str, ...]:
    """Every ``model_type`` with a parser, sorted."""
    _load()
    return tuple(sorted(_PARSERS))


def _pick_parser(view: ConfigView) -> tuple[str, Parser]:
    raw_type = view.data.get("model_type")
    if raw_type is not None and not isinstance(raw_type, str):
        raise view.error("model_type", f"must be a string, got {raw_type!r}")
    if raw_type in _PARSERS:
        return raw_type, _PARSERS[raw_type]
    supported = ", ".join(supported_model_types())
    if all(key in view.data for key in _LLAMA_KEYS):
        what = f"model_type {raw_type!r} is not supported" if raw_type else "no model_type"
        view.assumptions.append(
            f"{what}; read as a Llama-style decoder (gated MLP, RMSNorm, rotary). Supported: {supported}"
        )
        return raw_type or "unknown", _PARSERS[_FALLBACK]
    if raw_type is None:
        raise ConfigError(f"{view.source}: missing required key 'model_type'; expected one of {supported}")
    raise view.error("model_type", f"{raw_type!r} is not supported; expected one of {supported}")


def parse_config(
    data: Any,
    *,
    source: str = "config",
    name: str | None = None,
    hf_id: str | None = None,
) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed ``config.json`` object.

    ``source`` labels errors and the spec (a path, ``catalog:NAME``); ``name``
    and ``hf_id`` are recorded on the spec. Raises :class:`ConfigError` with a
    one-line message naming the offending key.
    """
    _load()
    view = ConfigView(data, source=source)
    model_type, parser = _pick_parser(view)
    spec = parser(view)
    updates: dict[str, Any] = {"name": name or hf_id or spec.name, "hf_id": hf_id}
    if isinstance(data, dict):
        updates["config"] = MappingProxyType(copy.deepcopy(data))
    if parser is _PARSERS[_FALLBACK] and model_type != spec.model_type:
        # An unsupported type read as Llama keeps its own name; aliases of a supported
        # family (Falcon's legacy RefinedWeb types) take the family's name.
        updates["model_type"] = model_type
    return dataclasses.replace(spec, **updates)
