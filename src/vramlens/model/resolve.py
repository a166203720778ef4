"""Turn whatever a user typed into a :class:`ModelSpec`.

Order of resolution for a string:

1. a catalog name, alias or HF id of a bundled checkpoint;
2. an existing path: a model directory (``config.json`` inside, safetensors
   headers read when present), a ``config.json`` file, or a ``.safetensors``
   file / index with a ``config.json`` beside it;
3. an ``org/name`` HF id found in the local HF cache (never downloaded).

Anything else is a :class:`ModelNotFoundError` that says what was tried.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Final

from vramlens._files import LIMITS, read_small_text
from vramlens._untrusted import load_json
from vramlens.errors import ConfigError, ModelNotFoundError
from vramlens.model.catalog import find_entry, suggest_names
from vramlens.model.families import parse_config
from vramlens.model.hub_cache import find_cached_snapshot, hub_cache_dir, looks_like_hf_id
from vramlens.model.spec import ModelSpec

__all__ = ["load_config_file", "load_model", "model_from_config"]

#: Refuse config files larger than this (real ones are a few KiB).
MAX_CONFIG_BYTES: Final = LIMITS["config"].limit


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a JSON config file (a regular file of at most 10 MiB, parsed with bounds by
    :func:`vramlens._untrusted.load_json`); errors name the file and the JSON problem."""
    file, text = read_small_text(path, limit=MAX_CONFIG_BYTES, error=ConfigError, what="a JSON model config")
    data = load_json(text, name=str(file), error=ConfigError, what="a JSON model config")
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: expected a JSON object at the top level, got {type(data).__name__}")
    return data


def model_from_config(config: dict[str, Any], *, name: str | None = None, source: str = "config") -> ModelSpec:
    """A :class:`ModelSpec` from a ``config.json``-style dict."""
    return parse_config(config, source=source, name=name)


def _has_safetensors(directory: Path) -> bool:
    return any(directory.glob("*.safetensors"))


def _from_directory(directory: Path, *, name: str | None = None, hf_id: str | None = None) -> ModelSpec:
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelNotFoundError(f"{directory}: no config.json in this directory; vramlens needs the model config")
    spec = parse_config(
        load_config_file(config_path), source=str(config_path), name=name or directory.name, hf_id=hf_id
    )
    if _has_safetensors(directory):
        from vramlens.model.safetensors import read_checkpoint

        spec = dataclasses.replace(spec, checkpoint=read_checkpoint(directory))
    return spec


def _from_path(path: Path) -> ModelSpec:
    if path.is_dir():
        return _from_directory(path)
    if path.suffix == ".safetensors" or path.name.endswith(".safetensors.index.json"):
        config_path = path.parent / "config.json"
        if not config_path.is_file():
            raise ModelNotFoundError(f"{path}: no config.json beside this checkpoint; vramlens needs the model config")
        spec = parse_config(load_config_file(config_path), source=str(config_path), name=path.parent.name)
        from vramlens.model.safetensors import read_checkpoint

        return dataclasses.replace(spec, checkpoint=read_checkpoint(path))
    return parse_config(
        load_config_file(path), source=str(path), name=path.parent.name if path.name == "config.json" else path.stem
    )


def _not_found(reference: str) -> ModelNotFoundError:
    close = suggest_names(reference)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    if looks_like_hf_id(reference):
        return ModelNotFoundError(
            f"model {reference!r} is not in the catalog and not in the local Hugging Face cache ({hub_cache_dir()}); "
            f"vramlens never downloads - fetch its config.json first (e.g. `hf download {reference} config.json`) "
            f"or pass a path.{hint}"
        )
    return ModelNotFoundError(
        f"model {reference!r} is not a catalog name (see `vramlens models list`), an existing path, "
        f"or an HF id (org/name) in the local cache.{hint}"
    )


def load_model(reference: str | os.PathLike[str] | dict[str, Any] | ModelSpec) -> ModelSpec:
    """Resolve a catalog name, path, cached HF id, config dict or spec into a :class:`ModelSpec`."""
    if isinstance(reference, ModelSpec):
        return reference
    if isinstance(reference, dict):
        return model_from_config(reference, source="dict")
    if isinstance(reference, os.PathLike):
        return _from_path(Path(reference))
    if not isinstance(reference, str) or not reference.strip():
        raise ModelNotFoundError(f"model: expected a catalog name, path or HF id, got {reference!r}")
    text = reference.strip()
    entry = find_entry(text)
    if entry is not None:
        return entry.spec()
    path = Path(text).expanduser()
    if path.exists():
        return _from_path(path)
    if looks_like_hf_id(text):
        snapshot = find_cached_snapshot(text)
        if snapshot is not None:
            return _from_directory(snapshot, name=text, hf_id=text)
    raise _not_found(text)
