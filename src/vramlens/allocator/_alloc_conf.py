"""Parser of ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF`` strings for the allocator model.

Follows ``ConfigTokenizer`` (c10/core/AllocatorConfig.h ~L20-L70) and
``AcceleratorAllocatorConfig::parseArgs`` / ``parseMaxSplitSize`` / ``parseRoundUpPower2Divisions``
(c10/core/AllocatorConfig.cpp ~L55-L230, PyTorch main late 2025) plus the CUDA-only keys of
``CUDAAllocatorConfig::parseArgs`` (c10/cuda/CUDAAllocatorConfig.cpp ~L60). Values in MB are
MiB (``kMB = 1024 * 1024``). Returns keyword arguments for ``AllocatorSettings``.
"""

from __future__ import annotations

from typing import Any

from vramlens.allocator._blocks import K_LARGE_BUFFER, ROUNDUP_INTERVALS

MIB = 1 << 20
#: Keys whose effect the model reproduces.
MODELED_KEYS = ("max_split_size_mb", "max_non_split_rounding_mb", "roundup_power2_divisions", "expandable_segments")
#: Keys PyTorch accepts that do not change the device caching allocator's segment layout here
#: (garbage collection only acts under set_per_process_memory_fraction; the others concern the
#: lock, pinned host memory or graph capture). Accepted and recorded in ``ignored_options``.
IGNORED_KEYS = (
    "garbage_collection_threshold",
    "backend",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
)
_SEPARATORS = frozenset(",:[]")


def tokenize(text: str) -> list[str]:
    """Split on ``, : [ ]`` (kept as tokens) and drop whitespace, as ``ConfigTokenizer`` does."""
    tokens: list[str] = []
    buffer = ""
    for char in text:
        if char in _SEPARATORS:
            if buffer:
                tokens.append(buffer)
                buffer = ""
            tokens.append(char)
        elif not char.isspace():
            buffer += char
    if buffer:
        tokens.append(buffer)
    return tokens


def parse_conf(text: str) -> dict[str, Any]:
    """Keyword arguments for ``AllocatorSettings`` from a config string such as
    ``'max_split_size_mb:128,expandable_segments:True'``; ValueError names the faulty key."""
    tokens = tokenize(text)
    fields: dict[str, Any] = {}
    ignored: list[str] = []
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if key not in MODELED_KEYS and key not in IGNORED_KEYS:
            accepted = ", ".join((*MODELED_KEYS, *IGNORED_KEYS))
            raise ValueError(f"allocator config: unknown key {key!r}; accepted keys: {accepted}")
        _expect(tokens, i + 1, ":", key)
        i = _parse_value(tokens, i + 2, key, fields, ignored)
        if i + 1 < len(tokens):
            _expect(tokens, i + 1, ",", key)
        i += 2
    if ignored:
        fields["ignored_options"] = tuple(dict.fromkeys(ignored))
    return fields


def _expect(tokens: list[str], i: int, token: str, key: str) -> None:
    if i >= len(tokens) or tokens[i] != token:
        found = repr(tokens[i]) if i < len(tokens) else "the end"
        raise ValueError(f"allocator config: expected {token!r} after {key!r}, found {found}")


def _value(tokens: list[str], i: int, key: str) -> str:
    if i >= len(tokens) or tokens[i] in _SEPARATORS - {"["}:
        raise ValueError(f"allocator config: {key} needs a value")
    return tokens[i]


def _parse_value(tokens: list[str], i: int, key: str, fields: dict[str, Any], ignored: list[str]) -> int:
    """Parse the value of ``key`` starting at token ``i``; returns the index of its last token."""
    value = _value(tokens, i, key)
    if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        megabytes = _unsigned(value, key)
        if megabytes < K_LARGE_BUFFER // MIB:
            raise ValueError(f"allocator config: {key} must be >= {K_LARGE_BUFFER // MIB} (MiB), got {megabytes}")
        name = "max_split_size_bytes" if key == "max_split_size_mb" else "max_non_split_rounding_bytes"
        fields[name] = megabytes * MIB
    elif key == "expandable_segments":
        if value not in ("True", "False"):
            raise ValueError(f"allocator config: expandable_segments accepts True or False, got {value!r}")
        fields["expandable_segments"] = value == "True"
    elif key == "roundup_power2_divisions":
        return _parse_divisions(tokens, i, fields)
    elif key == "backend" and value != "native":
        raise ValueError(f"allocator config: backend {value!r} is not modeled; only backend:native is")
    elif value == "[":
        i = _closing_bracket(tokens, i, key)
        ignored.append(key)
    else:
        ignored.append(key)
    return i


def _parse_divisions(tokens: list[str], i: int, fields: dict[str, Any]) -> int:
    """``roundup_power2_divisions``: one power of two for all sizes, or ``[MB:div, ..., >:div]``
    (``parseRoundUpPower2Divisions``: MB boundaries are powers of two naming the interval
    [MB, 2 MB); the first entry also fills every smaller interval; ``>`` fills the rest)."""
    key = "roundup_power2_divisions"
    if tokens[i] != "[":
        divisions = _unsigned(tokens[i], key)
        if not _is_power_of_two(divisions):
            raise ValueError(f"allocator config: {key} must be a power of two, got {divisions}")
        fields[key] = divisions
        fields.pop("roundup_power2_intervals", None)  # a later setting replaces the whole table
        return i
    table = [0] * ROUNDUP_INTERVALS
    first, last_index = True, 0
    end = _closing_bracket(tokens, i, key)
    i += 1
    while i < end:
        boundary = tokens[i]
        _expect(tokens, i + 1, ":", key)
        divisions = _unsigned(_value(tokens, i + 2, key), key)
        if divisions != 0 and not _is_power_of_two(divisions):
            raise ValueError(f"allocator config: {key} divisions must be 0 or a power of two, got {divisions}")
        if boundary == ">":
            table[last_index + 1 :] = [divisions] * (ROUNDUP_INTERVALS - last_index - 1)
        else:
            megabytes = _unsigned(boundary, key)
            if not _is_power_of_two(megabytes):
                raise ValueError(f"allocator config: {key} interval must be a power of two (MiB), got {megabytes}")
            index = min(megabytes.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:
                table[:index] = [divisions] * index
                first = False
            table[index] = divisions
            last_index = index
        i += 3
        if i < end:
            _expect(tokens, i, ",", key)
            i += 1
    fields["roundup_power2_intervals"] = tuple(table)
    fields.pop(key, None)
    return end


def _closing_bracket(tokens: list[str], i: int, key: str) -> int:
    try:
        return tokens.index("]", i)
    except ValueError:
        raise ValueError(f"allocator config: {key} list has no closing ']'") from None


#: Largest integer a value may hold: PyTorch parses values with ``std::stoul`` (64 bits).
_MAX_UNSIGNED = 2**64 - 1


def _unsigned(text: str, key: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 20 or int(text) > _MAX_UNSIGNED:
        raise ValueError(f"allocator config: {key} expects a non-negative integer below 2**64, got {text[:40]!r}")
    return int(text)


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0
