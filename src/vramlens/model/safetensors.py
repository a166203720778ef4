"""Read safetensors checkpoints from their headers only: exact tensor counts and bytes per dtype.

Format (https://github.com/huggingface/safetensors, "Format" section): an
8-byte little-endian unsigned header length ``N``, then ``N`` bytes of UTF-8
JSON mapping tensor names to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets relative to the end of the header) plus an optional ``__metadata__``
object of strings, then the data. Sharded checkpoints add
``model.safetensors.index.json`` with a ``weight_map`` of tensor -> file.

No tensor data is read: a 70B checkpoint is summarised from a few MiB of
headers. Every inconsistency (truncated file, bad JSON, unknown dtype, offsets
outside the file, sizes that do not match shapes) is a one-line
:class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import math
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final

from vramlens._files import LIMITS, FileKind, open_regular, read_regular
from vramlens._untrusted import load_json
from vramlens.errors import CheckpointError

__all__ = [
    "INDEX_NAME",
    "SAFETENSORS_DTYPE_BITS",
    "CheckpointSummary",
    "TensorEntry",
    "header_entries",
    "read_checkpoint",
    "read_safetensors_header",
    "tensor_entry",
]

#: Bits per element of every safetensors dtype (safetensors ``Dtype`` enum, v0.4+).
SAFETENSORS_DTYPE_BITS: Final[dict[str, int]] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip
#: safetensors refuses headers over 100 MB; so do we (it also bounds memory use).
MAX_HEADER_BYTES: Final = 100_000_000
INDEX_NAME: Final = "model.safetensors.index.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorEntry:
    """One stored tensor, as its header describes it."""

    name: str
    dtype: str
    """safetensors dtype name (BF16, F32, I32, F8_E4M3, ...)."""
    shape: tuple[int, ...]
    nbytes: int
    """Stored bytes (``end - begin`` of its data offsets)."""
    file: str
    """File name (within the checkpoint directory) holding it."""

    @property
    def numel(self) -> int:
        """Elements (product of the shape; 1 for a scalar)."""
        return math.prod(self.shape)


@dataclass(frozen=True, kw_only=True)
class CheckpointSummary:
    """Totals of a safetensors checkpoint (one file or a sharded set)."""

    path: str
    """The file, index or directory that was read."""
    files: tuple[str, ...]
    """Shard file names, in reading order."""
    tensors: tuple[TensorEntry, ...] = field(repr=False)
    metadata: dict[str, str] = field(default_factory=dict)
    """``__metadata__`` of the first file (e.g. ``{"format": "pt"}``)."""

    @property
    def num_tensors(self) -> int:
        return len(self.tensors)

    @property
    def total_elements(self) -> int:
        """Stored elements. Equals the parameter count for unquantized checkpoints
        (packed formats such as GPTQ store several weights per int32 element)."""
        return sum(t.numel for t in self.tensors)

    @property
    def total_bytes(self) -> int:
        """Stored tensor bytes (excluding headers)."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def elements_by_dtype(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for tensor in self.tensors:
            counts[tensor.dtype] += tensor.numel
        return dict(sorted(counts.items()))

    @property
    def bytes_by_dtype(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for tensor in self.tensors:
            counts[tensor.dtype] += tensor.nbytes
        return dict(sorted(counts.items()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe summary."""
        return {
            "path": self.path,
            "files": list(self.files),
            "num_tensors": self.num_tensors,
            "total_elements": self.total_elements,
            "total_bytes": self.total_bytes,
            "elements_by_dtype": self.elements_by_dtype,
            "bytes_by_dtype": self.bytes_by_dtype,
        }


def _fail(path: Path, problem: str) -> CheckpointError:
    return CheckpointError(f"{path}: {problem}")


def _read_header_json(path: Path) -> tuple[dict[str, Any], int]:
    """The decoded header object and the number of data bytes after it (a regular file only:
    the header length is checked against the file's size before anything is read)."""
    kind = FileKind(what="a .safetensors file", limit=1 << 62)
    with open_regular(path, kind, CheckpointError) as handle:
        return _header_from(handle, path)


def _header_from(handle: BinaryIO, path: Path) -> tuple[dict[str, Any], int]:
    """The header of an open ``.safetensors`` file (see :func:`_read_header_json`)."""
    try:
        size = os.fstat(handle.fileno()).st_size
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise _fail(path, f"truncated safetensors file: {size} bytes, expected an 8-byte header length first")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES:
            raise _fail(path, f"corrupt safetensors header: declared length {length} exceeds {MAX_HEADER_BYTES} bytes")
        if 8 + length > size:
            raise _fail(path, f"truncated safetensors header: declares {length} bytes but the file has {size - 8}")
        raw = handle.read(length)
    except OSError as exc:
        raise _fail(path, f"cannot read: {exc.strerror or exc}") from None
    header = load_json(raw, name=f"{path}: corrupt safetensors header", error=CheckpointError, max_values=None)
    if not isinstance(header, dict):
        raise _fail(path, "corrupt safetensors header: expected a JSON object")
    return header, size - 8 - length


def tensor_entry(source: str, name: str, info: Any, data_bytes: int | None) -> TensorEntry:
    """One header entry checked (dtype known, shape of non-negative ints, offsets matching the
    dtype and shape, and within ``data_bytes`` when the data's size is known); ``source`` (a
    path or an upload's name) starts every :class:`CheckpointError` message."""
    where = f"{source}: tensor {name!r}"
    if not isinstance(info, dict):
        raise CheckpointError(f"{where}: expected an object with dtype, shape and data_offsets")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPE_BITS:
        raise CheckpointError(f"{where}: unknown dtype {dtype!r}; expected one of {', '.join(SAFETENSORS_DTYPE_BITS)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise CheckpointError(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise CheckpointError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}")
    if data_bytes is not None and offsets[1] > data_bytes:
        raise CheckpointError(f"{where}: data_offsets {offsets!r} do not lie within the {data_bytes} data bytes")
    nbytes = offsets[1] - offsets[0]
    expected = (math.prod(shape) * SAFETENSORS_DTYPE_BITS[dtype] + 7) // 8
    if nbytes != expected:
        raise CheckpointError(f"{where}: {nbytes} bytes stored but shape {shape} of {dtype} needs {expected}")
    return TensorEntry(name=name, dtype=dtype, shape=tuple(shape), nbytes=nbytes, file=Path(source).name)


def header_entries(
    header: dict[str, Any], source: str, data_bytes: int | None
) -> tuple[tuple[TensorEntry, ...], dict[str, str]]:
    """The checked tensors and ``__metadata__`` of a decoded header object (``header`` is not
    changed)."""
    header = dict(header)
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{source}: corrupt safetensors header: __metadata__ must map strings to strings")
    return tuple(tensor_entry(source, name, info, data_bytes) for name, info in header.items()), metadata


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[tuple[TensorEntry, ...], dict[str, str]]:
    """The tensors and ``__metadata__`` of one ``.safetensors`` file, from its header only."""
    file = Path(path)
    header, data_bytes = _read_header_json(file)
    return header_entries(header, str(file), data_bytes)


def _read_index(index: Path) -> dict[str, str]:
    data = read_regular(index, LIMITS["safetensors-index"], CheckpointError)
    raw = load_json(data, name=str(index), error=CheckpointError, what="a safetensors index", max_values=None)
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise _fail(index, "'weight_map' must map tensor names to shard file names")
    for shard in set(weight_map.values()):
        if Path(shard).name != shard:
            raise _fail(index, f"weight_map names shard {shard!r} outside the checkpoint directory")
    return weight_map


def _read_sharded(index: Path) -> CheckpointSummary:
    weight_map = _read_index(index)
    files = tuple(dict.fromkeys(weight_map.values()))
    tensors: list[TensorEntry] = []
    metadata: dict[str, str] = {}
    for name in files:
        shard = index.parent / name
        if not shard.is_file():
            raise _fail(index, f"shard {name!r} listed in weight_map is missing")
        found, meta = read_safetensors_header(shard)
        metadata = metadata or meta
        names = {t.name for t in found}
        missing = [t for t, f in weight_map.items() if f == name and t not in names]
        if missing:
            raise _fail(shard, f"tensor {missing[0]!r} listed in {index.name} is not in this shard")
        tensors.extend(found)
    return CheckpointSummary(path=str(index), files=files, tensors=tuple(tensors), metadata=metadata)


def read_checkpoint(path: str | os.PathLike[str]) -> CheckpointSummary:
    """Summarise a checkpoint: a ``.safetensors`` file, an index ``.json``, or a directory.

    A directory is read through ``model.safetensors.index.json`` when present,
    else ``model.safetensors``, else every ``*.safetensors`` file in it.
    """
    target = Path(path)
    if target.is_dir():
        if (target / INDEX_NAME).is_file():
            return _read_sharded(target / INDEX_NAME)
        files = (
            [target / "model.safetensors"]
            if (target / "model.safetensors").is_file()
            else sorted(target.glob("*.safetensors"))
        )
        if not files:
            raise _fail(target, "no .safetensors files in this directory")
    elif target.suffix == ".json":
        return _read_sharded(target)
    elif target.is_file():
        files = [target]
    else:
        raise _fail(target, "no such file or directory")
    tensors: list[TensorEntry] = []
    metadata: dict[str, str] = {}
    for file in files:
        found, meta = read_safetensors_header(file)
        metadata = metadata or meta
        tensors.extend(found)
    return CheckpointSummary(
        path=str(target), files=tuple(f.name for f in files), tensors=tuple(tensors), metadata=metadata
    )
