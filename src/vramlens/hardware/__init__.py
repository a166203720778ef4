"""The GPU table: capacity, bandwidth and peak FLOPs of common accelerators, each with its source.

Data lives in ``gpus.json`` beside this module (one object per GPU with the
source of every figure). ``gpu`` in a workload is a name or alias from the
table, or a plain size such as ``"24GiB"`` for anything else. Names are also read as
``nvidia-smi`` and ``torch.cuda.get_device_name()`` print them (``"NVIDIA GeForce RTX 4090"``,
``"NVIDIA H100 80GB HBM3"``, ``"Tesla V100-SXM2-32GB"``): case, spaces and underscores do not
matter, and a leading ``NVIDIA``/``AMD``/``Tesla``/``GeForce`` may be left out.

Capacity (``memory_bytes``) is what CUDA reports as the device's total memory
(``torch.cuda.get_device_properties().total_memory``), which is what a process
can fill; where only nvidia-smi's total is known it is used, and where only the
marketing size is known, that, and the GPU's ``capacity_basis`` says which.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from vramlens._files import package_data
from vramlens.errors import InputError
from vramlens.units import MiB, parse_size

__all__ = ["GpuSpec", "gpu_table", "normalize_gpu_name", "resolve_gpu", "same_memory"]

#: Words a vendor prints before the model name; a name is also looked up without them.
_PREFIXES = ("nvidia-geforce-", "nvidia-", "amd-instinct-", "amd-", "tesla-", "geforce-")
#: Relative difference of capacity under which two cards count as having the same memory.
SAME_MEMORY_TOLERANCE = 0.03


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSpec:
    """One accelerator."""

    name: str
    """Canonical id (``h100-sxm-80gb``) or the size string a user gave."""
    display_name: str
    memory_bytes: int
    """Usable capacity in bytes (see module docstring)."""
    capacity_basis: str
    """"torch total_memory", "nvidia-smi total", "marketing" or "user size"."""
    aliases: tuple[str, ...] = ()
    marketed_gb: int | None = None
    """The memory size the vendor sells the card with (``80`` for an "80GB" card); None for user sizes."""
    vendor: str | None = None
    architecture: str | None = None
    memory_bandwidth_bytes_per_s: float | None = None
    peak_dense_flops: dict[str, float | None] = field(default_factory=dict)
    nvlink_bytes_per_s: float | None = None
    pcie: str | None = None
    source: str = ""


def _capacity(raw: dict[str, Any]) -> tuple[int, str]:
    if raw.get("total_memory_bytes"):
        return int(raw["total_memory_bytes"]), "torch total_memory"
    if raw.get("nvidia_smi_total_mib"):
        return int(raw["nvidia_smi_total_mib"]) * MiB, "nvidia-smi total"
    return int(raw["memory_gib_marketing"]) * 10**9, "marketing"


def _from_json(raw: dict[str, Any]) -> GpuSpec:
    memory, basis = _capacity(raw)
    interconnect = raw.get("interconnect") or {}
    return GpuSpec(
        name=raw["name"],
        display_name=raw.get("display_name", raw["name"]),
        memory_bytes=memory,
        capacity_basis=basis,
        aliases=tuple(raw.get("aliases", ())),
        marketed_gb=int(raw["memory_gib_marketing"]),
        vendor=raw.get("vendor"),
        architecture=raw.get("architecture"),
        memory_bandwidth_bytes_per_s=raw.get("memory_bandwidth_bytes_per_s"),
        peak_dense_flops=dict(raw.get("peak_dense_flops") or {}),
        nvlink_bytes_per_s=interconnect.get("nvlink_bytes_per_s"),
        pcie=interconnect.get("pcie"),
        source=raw.get("spec_source", ""),
    )


@cache
def gpu_table() -> tuple[GpuSpec, ...]:
    """Every GPU in the bundled table."""
    text = package_data(__name__).joinpath("gpus.json").read_text(encoding="utf-8")
    return tuple(_from_json(raw) for raw in json.loads(text))


def normalize_gpu_name(text: str) -> str:
    """A GPU name as the table's keys are written: lower case, words joined by ``-``
    (``"NVIDIA GeForce RTX 4090"`` -> ``"nvidia-geforce-rtx-4090"``)."""
    return re.sub(r"[\s_\-]+", "-", text.strip().lower().replace("(tm)", "").replace("(r)", "")).strip("-")


def _candidates(key: str) -> list[str]:
    """``key`` and its forms without a leading vendor word."""
    keys = [key]
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            keys.append(key[len(prefix) :])
    return keys


@cache
def _index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for gpu in gpu_table():
        for key in (gpu.name, *gpu.aliases, gpu.display_name):
            for form in _candidates(normalize_gpu_name(key)):
                index.setdefault(form, gpu)
    return index


def _lookup(value: str) -> GpuSpec | None:
    index = _index()
    for key in _candidates(normalize_gpu_name(value)):
        if key in index:
            return index[key]
    return None


def same_memory(gpu: GpuSpec) -> list[GpuSpec]:
    """The other cards of the table sold with the same memory (a user size: within
    :data:`SAME_MEMORY_TOLERANCE` of its bytes), closest capacity first."""
    if gpu.marketed_gb is not None:
        close = [g for g in gpu_table() if g.marketed_gb == gpu.marketed_gb and g.name != gpu.name]
    else:
        sold = {gpu.memory_bytes / 10**9, gpu.memory_bytes / 2**30}  # "48GB" or "48GiB": cards sold as 48 GB
        close = [
            g
            for g in gpu_table()
            if g.marketed_gb in sold
            or abs(g.memory_bytes - gpu.memory_bytes) <= SAME_MEMORY_TOLERANCE * gpu.memory_bytes
        ]
    return sorted(close, key=lambda g: (abs(g.memory_bytes - gpu.memory_bytes), g.name))


_SIZE_IN_NAME = re.compile(r"(?<![0-9])([0-9]{1,3})\s*gb?(?![a-z0-9])", re.IGNORECASE)


#: GPU sizes accepted (bytes): from 256 MiB (the smallest embedded GPUs have 1 GiB) to 64 TiB
#: (the largest GPUs hold 288 GB); a bare ``--gpu 1`` is one byte, a typo.
GPU_SIZE_RANGE = (256 * 2**20, 64 * 2**40)


#: GPUs already resolved from the table, by the value given (an estimate resolves its GPU each time).
_RESOLVED: dict[str, GpuSpec] = {}


def resolve_gpu(value: str, *, field_name: str = "gpu") -> GpuSpec:
    """A GPU from the table by name or alias, or a custom one from a size ("24GiB", "80 GB")."""
    found = _RESOLVED.get(value) if type(value) is str else None
    if found is not None:
        return found
    key = value.strip().lower()
    if len(key) > 100:
        raise InputError(f"{field_name}: {len(key):,} characters is not a GPU name or size")
    gpu = _lookup(value)
    if gpu is not None:
        if len(_RESOLVED) < 1024:
            _RESOLVED[value] = gpu
        return gpu
    if key[:1].isdigit():
        size = parse_size(value, field=field_name)
        low, high = GPU_SIZE_RANGE
        if not low <= size <= high:
            raise InputError(
                f"{field_name}: a GPU size must be from 256 MiB to 64 TiB, got {value.strip()!r} ({size:,} bytes); "
                "write the unit, e.g. 24GiB or 80GB (a bare number is bytes)"
            )
        return GpuSpec(
            name=value.strip(), display_name=f"GPU with {value.strip()}", memory_bytes=size, capacity_basis="user size"
        )
    raise InputError(f"{field_name}: unknown GPU {value!r}{_hint(value)}; expected a size such as '24GiB' or one of "
                     f"{', '.join(g.name for g in gpu_table())}")  # fmt: skip


def _hint(value: str) -> str:
    """ "did you mean" for a close name, and the cards with the memory a name states ("A100-PCIE-40GB")."""
    key = normalize_gpu_name(value)
    import difflib  # on a miss only (2 ms of a cold start)

    close = difflib.get_close_matches(key, list(_index()), n=1)
    hint = f" (did you mean {_index()[close[0]].name!r}?)" if close else ""
    size = _SIZE_IN_NAME.search(value)
    if size is not None:
        marketed = int(size.group(1))
        cards = [g.name for g in gpu_table() if g.marketed_gb == marketed]
        if cards:
            hint += f"; cards sold with {marketed} GB: {', '.join(cards)} (or give the size, '{marketed}GB')"
    return hint
