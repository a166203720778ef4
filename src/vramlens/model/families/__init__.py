"""Registry of config parsers, one per ``model_type``, and the dispatch of a config to one.

A family module registers a parser with :func:`register`; adding a model family means
adding a module here (and its types in ``_FAMILY_MODULES``; imported on first use), never an ``elif``.
:func:`parse_config` dispatches on ``model_type``:

1. a native family parser (hand-written formulas, the fast and explained path);
2. a remote-code type listed in :mod:`vramlens.model.families.aliases`, read as the family
   whose code it ships (the alias is recorded in the spec's assumptions);
3. anything else is described from transformers' own code by the generic reader
   (:mod:`vramlens.model.generic`, needs the ``[hf]`` extra), or refused in one line.

Nothing is ever read as a look-alike of another family.
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
from vramlens.model.families.aliases import ALIASES
from vramlens.model.spec import ModelSpec

__all__ = ["Parser", "parse_config", "register", "supported_model_types"]

Parser = Callable[[ConfigView], ModelSpec]

#: model_type -> the family module that registers its parser: one record per family type, so
#: that reading a model imports only its own family's module (a test checks the table against
#: what the modules register).
_FAMILY_MODULES: dict[str, str] = {
    "cohere2": "cohere2",
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
    "falcon": "gpt",
    "falcon_h1": "falcon_h1",
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3_text": "gemma",
    "glm4_moe": "glm4_moe",
    "gpt2": "gpt",
    "gpt_neox": "gpt",
    "gpt_oss": "gpt_oss",
    "granitemoehybrid": "granite_hybrid",
    "jamba": "jamba",
    "llama": "llama",
    "llama4": "llama4",
    "llama4_text": "llama4",
    "ministral3": "mistral3",
    "mistral": "llama",
    "mistral3": "mistral3",
    "mixtral": "llama",
    "nemotron_h": "nemotron_h",
    "olmo2": "llama",
    "olmoe": "olmoe",
    "phi": "phi",
    "phi3": "phi",
    "qwen2": "llama",
    "qwen2_5_vl": "qwen_vl",
    "qwen2_moe": "llama",
    "qwen3": "llama",
    "qwen3_moe": "llama",
    "qwen3_next": "qwen3_next",
    "qwen3_vl": "qwen_vl",
    "qwen3_vl_moe": "qwen_vl",
    "smollm3": "smollm3",
    "starcoder2": "gpt",
}
_PARSERS: dict[str, Parser] = {}


def register(*model_types: str) -> Callable[[Parser], Parser]:
    """Decorator: register ``parser`` for each of ``model_types`` (duplicates are an error)."""

    def decorate(parser: Parser) -> Parser:
        for model_type in model_types:
            if model_type in _PARSERS:
                raise RuntimeError(f"model_type {model_type!r} registered twice")
            _PARSERS[model_type] = parser
        return parser

    return decorate


def _load(model_type: str) -> None:
    """Import the family module that registers ``model_type``'s parser (once)."""
    if model_type not in _PARSERS:
        importlib.import_module(f"{__name__}.{_FAMILY_MODULES[model_type]}")


def supported_model_types() -> tuple[str, ...]:
    """Every ``model_type`` with a native parser, sorted (aliases and the generic path aside)."""
    return tuple(sorted(_FAMILY_MODULES))


def _model_type(data: Any, source: str) -> str:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
    raw = data.get("model_type")
    if raw is None:
        raise ConfigError(
            f"{source}: missing required key 'model_type'; vramlens reads a model from its config.json, "
            "which names its architecture in 'model_type'"
        )
    if not isinstance(raw, str) or not raw:
        raise ConfigError(f"{source}: key 'model_type' must be a non-empty string, got {raw!r}")
    return raw


def _native(data: dict[str, Any], model_type: str, source: str) -> ModelSpec:
    """Parse with a native parser, through the alias table for remote-code types."""
    alias = ALIASES.get(model_type)
    if alias is not None:
        data = {**alias.defaults, **data, "model_type": alias.target}
        data.pop("auto_map", None)
    view = ConfigView(data, source=source)
    if alias is not None:
        view.assumptions.append(f"model_type {model_type!r} is read as {alias.target}: {alias.source}")
    target = alias.target if alias is not None else model_type
    _load(target)
    spec = _PARSERS[target](view)
    return dataclasses.replace(spec, config=MappingProxyType(copy.deepcopy(data)))


def _describe_generic(data: dict[str, Any], model_type: str, source: str) -> ModelSpec:
    """The generic reader of transformers' code (imported only for types without a family)."""
    from vramlens.model.generic import describe_config

    return describe_config(data, model_type=model_type, source=source)


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
    one-line message naming the offending key, or saying why the ``model_type``
    cannot be described and what would help.
    """
    model_type = _model_type(data, source)
    if model_type in _FAMILY_MODULES or model_type in ALIASES:
        spec = _native(data, model_type, source)
    else:
        spec = _describe_generic(data, model_type, source)
    return dataclasses.replace(spec, name=name or hf_id or spec.name, hf_id=hf_id)
