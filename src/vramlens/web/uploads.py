"""Uploaded model files: a ``config.json``, a safetensors index, or a safetensors header.

Nothing uploaded is executed or written to disk: JSON is read with :func:`json.loads`, the
config goes through the same parser as ``vramlens models show config.json``
(:func:`vramlens.model.model_from_config`), and a safetensors header is decoded from the
bytes with the checks of :mod:`vramlens.model.safetensors` (known dtype, shape of
non-negative integers, stored bytes matching the shape). A header carries no tensor data, so
offsets are checked against the shape only, not against a file size.

An uploaded config becomes a model the API can use: :class:`UploadStore` keeps the last
:data:`MAX_UPLOADED_MODELS` specs under ``upload:<first 12 hex digits of the upload's
SHA-256>``, which the page then sends as the workload's ``model``. The store is in memory:
after a restart the page uploads again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import shutil
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from functools import cache
from pathlib import Path
from typing import Any, Final

from vramlens._untrusted import MAX_DOCUMENT_VALUES, load_json
from vramlens.errors import CheckpointError, ConfigError, InputError
from vramlens.model.catalog import find_entry, suggest_names
from vramlens.model.resolve import model_from_config
from vramlens.model.safetensors import CheckpointSummary, header_entries
from vramlens.model.serialize import spec_summary
from vramlens.model.spec import ModelSpec
from vramlens.units import format_bytes, format_count
from vramlens.web.limits import UploadKind, sniff_upload

__all__ = [
    "MAX_UPLOADED_MODELS",
    "ModelRecipe",
    "STALE_UPLOAD_PREFIX",
    "UPLOAD_PREFIX",
    "UploadStore",
    "build_model",
    "parse_upload",
    "release_memory",
    "sweep_stale_uploads",
]

#: Uploaded models kept at once (least recently used dropped first).
MAX_UPLOADED_MODELS: Final = 32
UPLOAD_PREFIX: Final = "upload:"
#: Folders earlier versions wrote snapshot uploads to (now read in memory): swept at start-up.
STALE_UPLOAD_PREFIX: Final = "vramlens-web-"


def sweep_stale_uploads(folder: str | None = None, *, older_than_s: float = 60.0) -> int:
    """Remove this user's ``vramlens-web-*`` folders in the temporary directory that are older
    than ``older_than_s`` (left by a server that was killed while it read an upload); returns
    how many were removed. Uploads are read in memory now, so only old versions leave them."""
    base = Path(folder or tempfile.gettempdir())
    removed = 0
    now = time.time()
    for entry in base.glob(f"{STALE_UPLOAD_PREFIX}*"):
        try:
            info = entry.lstat()
            mine = not hasattr(os, "getuid") or info.st_uid == os.getuid()
            if entry.is_dir() and not entry.is_symlink() and mine and now - info.st_mtime > older_than_s:
                shutil.rmtree(entry)
                removed += 1
        except OSError:
            continue
    return removed


@cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        library = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return library if library is not None and hasattr(library, "malloc_trim") else None


def release_memory() -> None:
    """Give memory freed by a large request back to the system (glibc keeps freed arenas of
    worker threads otherwise, and the server's resident size would only grow); no-op elsewhere."""
    library = _libc()
    if library is not None:
        library.malloc_trim(0)


#: How to build a model in another process: ``("catalog", name, _)`` or ``("config", document,
#: name, source)`` (plain data: it is pickled to the plan's process).
ModelRecipe = tuple[Any, ...]


def build_model(recipe: ModelRecipe) -> ModelSpec:
    """The model a :meth:`UploadStore.recipe` describes."""
    if recipe[0] == "catalog":
        entry = find_entry(recipe[1])
        if entry is None:
            raise InputError(f"model: {recipe[1]!r} is not a catalog name")
        return entry.spec()
    _, document, name, source = recipe
    return model_from_config(document, name=name, source=source)


class UploadStore:
    """Uploaded model specs by token, least recently used dropped first (thread-safe)."""

    def __init__(self, capacity: int = MAX_UPLOADED_MODELS) -> None:
        self._specs: OrderedDict[str, ModelSpec] = OrderedDict()
        self._recipes: dict[str, ModelRecipe] = {}
        self._capacity = capacity
        self._lock = threading.Lock()

    def add(self, spec: ModelSpec, data: bytes, recipe: ModelRecipe | None = None) -> str:
        """Keep ``spec`` (uploaded as ``data``) under its token; ``recipe`` rebuilds it in
        another process (a plan's, :func:`build_model`)."""
        token = UPLOAD_PREFIX + hashlib.sha256(data).hexdigest()[:12]
        with self._lock:
            self._specs[token] = spec
            self._specs.move_to_end(token)
            if recipe is not None:
                self._recipes[token] = recipe
            while len(self._specs) > self._capacity:
                dropped, _ = self._specs.popitem(last=False)
                self._recipes.pop(dropped, None)
        return token

    def recipe(self, reference: Any) -> ModelRecipe:
        """How :func:`build_model` rebuilds the model of a workload's ``model`` value in another
        process (refused as :meth:`resolve` refuses)."""
        spec = self.resolve(reference)
        text = str(reference).strip()
        with self._lock:
            found = self._recipes.get(text)
        if found is not None:
            return found
        return ("catalog", text, spec.name)

    def resolve(self, reference: Any) -> Any:
        """The model of a workload's ``model`` value: an uploaded spec for ``upload:...``, a
        catalog spec for a catalog name; anything else is refused (the API never opens paths
        or the Hugging Face cache; the CLI does)."""
        if not isinstance(reference, str) or not reference.strip():
            return reference  # the workload loader names the problem
        text = reference.strip()
        if text.startswith(UPLOAD_PREFIX):
            with self._lock:
                spec = self._specs.get(text)
                if spec is not None:
                    self._specs.move_to_end(text)
            if spec is None:
                raise InputError(
                    f"model: {text!r} is not held by this server (it keeps the last {self._capacity} uploads "
                    "until it restarts); upload the config.json again"
                )
            return spec
        entry = find_entry(text)
        if entry is None:
            close = suggest_names(text)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise InputError(
                f"model {text!r} is not a catalog name (see GET /api/models); the web API takes catalog names "
                f"and uploaded configs (POST /api/config), not paths.{hint}"
            )
        return entry.spec()


def _json(data: bytes, name: str, *, max_values: int | None = MAX_DOCUMENT_VALUES) -> Any:
    return load_json(data, name=name, error=ConfigError, what="a JSON model config", max_values=max_values)


def _index(document: dict[str, Any], name: str) -> dict[str, Any]:
    """A ``model.safetensors.index.json``: tensors per shard (the shards themselves are not uploaded)."""
    weight_map = document.get("weight_map")
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise CheckpointError(f"{name}: 'weight_map' must map tensor names to shard file names")
    shards: dict[str, int] = {}
    for shard in weight_map.values():
        shards[shard] = shards.get(shard, 0) + 1
    metadata = document.get("metadata")
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    note = f"{name}: safetensors index of {len(weight_map)} tensors in {len(shards)} shards"
    if isinstance(total, int) and not isinstance(total, bool):
        note += f", {format_bytes(total)} declared"
    return {
        "kind": "safetensors-index",
        "name": name,
        "note": note + " (a checkpoint listing: choose a catalog model or upload its config.json to estimate)",
        "num_tensors": len(weight_map),
        "shards": [{"file": file, "tensors": count} for file, count in shards.items()],
        "total_size_bytes": total if isinstance(total, int) and not isinstance(total, bool) else None,
    }


def _header(data: bytes, name: str) -> dict[str, Any]:
    """The first bytes of a ``.safetensors`` file: its tensors' dtypes, shapes and bytes."""
    (length,) = struct.unpack("<Q", data[:8])
    header = _json(data[8 : 8 + length], name, max_values=None)
    if not isinstance(header, dict):
        raise CheckpointError(f"{name}: corrupt safetensors header: expected a JSON object")
    tensors, metadata = header_entries(header, name, None)  # only the header is uploaded
    summary = CheckpointSummary(path=name, files=(name,), tensors=tensors, metadata=dict(metadata))
    dtypes = ", ".join(f"{dtype} {format_bytes(size)}" for dtype, size in summary.bytes_by_dtype.items())
    note = (
        f"{name}: safetensors header of {summary.num_tensors} tensors, {format_count(summary.total_elements)} "
        f"elements, {format_bytes(summary.total_bytes)} ({dtypes or 'no tensors'})"
    )
    return {"kind": "safetensors-header", "name": name, "note": note, **summary.to_dict()}


def parse_upload(data: bytes, name: str, store: UploadStore) -> dict[str, Any]:
    """Read one upload (module docstring). A config answers ``{"kind": "config", "model":
    "upload:...", "summary": {...}}``; an index or header answers its tensor summary."""
    if not data:
        raise InputError(f"{name}: empty upload; expected a config.json or a safetensors index or header")
    if sniff_upload(data, name=name) is UploadKind.SAFETENSORS_HEADER:
        return _header(data, name)
    document = _json(data, name)
    if not isinstance(document, dict):
        raise ConfigError(f"{name}: expected a JSON object at the top level, got {type(document).__name__}")
    if "weight_map" in document:
        return _index(document, name)
    stem = name.rsplit("/", 1)[-1].removesuffix(".json")
    shown = stem if stem and stem != "config" else None
    spec = model_from_config(document, name=shown, source=name)
    token = store.add(spec, data, ("config", document, shown, name))
    summary = spec_summary(spec)
    note = (
        f"{name}: {spec.name} ({spec.model_type}), {format_count(spec.num_parameters)} parameters, "
        f"{spec.num_layers} layers; selected as {token}"
    )
    return {"kind": "config", "name": name, "note": note, "model": token, "summary": summary}
