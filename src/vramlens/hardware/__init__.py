"""The GPU table: capacity, bandwidth and peak FLOPs of common accelerators, each with its source.

Data lives in ``gpus.json`` beside this module (one object per GPU with the
source of every figure). ``gpu`` in a workload is a name or alias from the
table, or a plain size such as ``"24GiB"`` for anything else.

Capacity (``memory_bytes``) is what CUDA reports as the device's total memory
(``torch.cuda.get_device_properties().total_memory``), which is what a process
can fill; where only nvidia-smi's total is known it is used, and where only the
marketing size is known, that, and the GPU's ``capacity_basis`` says which.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from vramlens.errors import InputError
from vramlens.units import MiB, parse_size

__all__ = ["GpuSpec", "gpu_table", "resolve_gpu"]


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
    text = resources.files(__name__).joinpath("gpus.json").read_text(encoding="utf-8")
    return tuple(_from_json(raw) for raw in json.loads(text))


@cache
def _index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for gpu in gpu_table():
        for key in (gpu.name, *gpu.aliases):
            index.setdefault(key.lower(), gpu)
    return index


#: GPU sizes accepted (bytes): from 256 MiB (the smallest embedded GPUs have 1 GiB) to 64 TiB
#: (the largest GPUs hold 288 GB); a bare ``--gpu 1`` is one byte, a typo.
GPU_SIZE_RANGE = (256 * 2**20, 64 * 2**40)


def resolve_gpu(value: str, *, field_name: str = "gpu") -> GpuSpec:
    """A GPU from the table by name or alias, or a custom one from a size ("24GiB", "80 GB")."""
    key = value.strip().lower()
    gpu = _index().get(key)
    if gpu is not None:
        return gpu
    if len(key) > 100:
        raise InputError(f"{field_name}: {len(key):,} characters is not a GPU name or size")
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
    names = ", ".join(g.name for g in gpu_table())
    close = difflib.get_close_matches(key, list(_index()), n=1)
    hint = f" (did you mean {_index()[close[0]].name!r}?)" if close else ""
    raise InputError(f"{field_name}: unknown GPU {value!r}{hint}; expected a size such as '24GiB' or one of {names}")
