"""The GPU table (hardware/gpus.json): every row is complete and plausible, each capacity equals the figure its
cited source quotes, names and aliases are unique, and resolve_gpu takes names, aliases and plain sizes."""

from __future__ import annotations

import difflib
import json
import re
import subprocess
import sys
from importlib import resources
from typing import Any

import pytest

from vramlens.errors import InputError
from vramlens.hardware import GpuSpec, gpu_table, resolve_gpu

MiB, GiB, GB = 2**20, 2**30, 10**9
FLOP_DTYPES = {"fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8"}
RAW: list[dict[str, Any]] = json.loads(resources.files("vramlens.hardware").joinpath("gpus.json").read_text())
RAW_BY_NAME = {row["name"]: row for row in RAW}
NAMES = [gpu.name for gpu in gpu_table()]


def error_for(value: str, **kwargs: Any) -> str:
    with pytest.raises(InputError) as info:
        resolve_gpu(value, **kwargs)
    message = str(info.value)
    assert "\n" not in message and "\r" not in message, message
    return message


def test_table_matches_the_json_file() -> None:
    assert len(gpu_table()) == len(RAW) >= 20
    assert all(isinstance(gpu, GpuSpec) for gpu in gpu_table())


@pytest.mark.parametrize("gpu", gpu_table(), ids=NAMES)
def test_every_row_is_complete(gpu: GpuSpec) -> None:
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", gpu.name), gpu.name
    assert gpu.display_name.strip() and gpu.architecture and gpu.vendor and gpu.vendor == gpu.vendor.lower()
    assert isinstance(gpu.memory_bytes, int) and gpu.memory_bytes > 0
    assert gpu.capacity_basis in {"torch total_memory", "nvidia-smi total", "marketing"}
    assert len(gpu.source.strip()) > 20
    assert set(gpu.peak_dense_flops) == FLOP_DTYPES
    raw = RAW_BY_NAME[gpu.name]
    assert raw["total_memory_source"].strip() and raw["spec_source"].strip()


@pytest.mark.parametrize("gpu", gpu_table(), ids=NAMES)
def test_rates_are_in_plausible_units(gpu: GpuSpec) -> None:
    # Catches unit slips (TFLOPS or GB/s written where FLOP/s or B/s are expected); null means "not found".
    if gpu.memory_bandwidth_bytes_per_s is not None:
        assert 1e11 <= gpu.memory_bandwidth_bytes_per_s <= 1e14
    flops = {k: v for k, v in gpu.peak_dense_flops.items() if v is not None}
    assert all(1e12 <= v <= 1e17 for v in flops.values()), flops
    if "bf16" in flops and "fp16" in flops:
        assert flops["bf16"] == flops["fp16"]
    for low, high in (("fp32", "bf16"), ("fp32", "fp16"), ("bf16", "fp8"), ("tf32", "bf16")):
        if low in flops and high in flops:
            assert flops[low] <= flops[high], (low, high)
    if gpu.nvlink_bytes_per_s is not None:
        assert 1e10 <= gpu.nvlink_bytes_per_s <= 1e13


@pytest.mark.parametrize("gpu", gpu_table(), ids=NAMES)
def test_rates_are_present_unless_the_notes_say_why_not(gpu: GpuSpec) -> None:
    if "left null" in RAW_BY_NAME[gpu.name].get("notes", ""):  # e.g. a10g: "FLOPs left null: ... not found"
        return
    assert gpu.memory_bandwidth_bytes_per_s is not None
    assert gpu.peak_dense_flops["fp32"] is not None and gpu.peak_dense_flops["fp16"] is not None


def test_names_and_aliases_are_unique_after_normalization() -> None:
    keys = [key.strip().lower() for gpu in gpu_table() for key in (gpu.name, *gpu.aliases)]
    duplicates = {key for key in keys if keys.count(key) > 1}
    assert not duplicates


def test_no_alias_hides_a_gpu_size() -> None:
    # "4090" is an alias; an alias must never look like a capacity such as "80gb" or "24GiB".
    for gpu in gpu_table():
        for key in (gpu.name, *gpu.aliases):
            assert not re.fullmatch(r"[0-9.]+\s*(k|m|g|t)?i?b", key.lower()), key


# ---- capacities against the text each row cites --------------------------------------------------------

#: How each cited source prints the capacity, and how the stored bytes follow from what it prints.
_QUOTES: list[tuple[re.Pattern[str], Any]] = [
    # CUDA deviceQuery: "81090 MBytes (85028896768 bytes)"; MBytes is bytes / 2**20 printed with %.0f.
    (re.compile(r"(\d+) MBytes \((\d+) bytes\)"), lambda m, b: b == int(m[2]) and round(b / MiB) == int(m[1])),
    # torch repr "total_memory=143156MB": integer MiB (bytes // 2**20).
    (re.compile(r"total_memory=(\d+)MB"), lambda m, b: b == int(m[1]) * MiB),
    # rocm-smi "VRAM Total Memory (B): 205822885888".
    (re.compile(r"VRAM Total Memory \(B\): (\d+)"), lambda m, b: b == int(m[1])),
    # PyTorch OOM "total capacity of 79.19 GiB": two decimals of GiB.
    (re.compile(r"total capacity of (\d+\.\d\d) GiB"), lambda m, b: f"{b / GiB:.2f}" == m[1]),
    # fastfetch "dedicated memory total 99961274368 bytes".
    (re.compile(r"total (\d{9,}) bytes"), lambda m, b: b == int(m[1])),
]


@pytest.mark.parametrize("row", RAW, ids=[row["name"] for row in RAW])
def test_capacity_equals_the_first_figure_its_source_quotes(row: dict[str, Any]) -> None:
    text, stored = row["total_memory_source"], row["total_memory_bytes"]
    quotes = sorted((m.start(), m, check) for pattern, check in _QUOTES if (m := pattern.search(text)))
    assert quotes, f"{row['name']}: no recognizable figure in total_memory_source"
    _, match, check = quotes[0]
    assert check(match, stored), (row["name"], match.group(0), stored)
    assert resolve_gpu(row["name"]).memory_bytes == stored


@pytest.mark.parametrize("row", [r for r in RAW if r.get("nvidia_smi_total_mib")], ids=lambda r: r["name"])
def test_cuda_total_is_a_little_below_nvidia_smi_total(row: dict[str, Any]) -> None:
    # CUDA's total_memory excludes what the driver reserves, so it is below nvidia-smi's total, by a few %.
    smi = row["nvidia_smi_total_mib"] * MiB
    assert 0.95 * smi <= row["total_memory_bytes"] < smi


@pytest.mark.parametrize("row", RAW, ids=[row["name"] for row in RAW])
def test_capacity_is_consistent_with_the_marketed_size(row: dict[str, Any]) -> None:
    # Usable memory never exceeds the marketed size even read as GiB, and is at least 90 % of it read as GB;
    # MI250X rows are per GCD (half a package), as the source says.
    per_device = row["memory_gib_marketing"] / (2 if row["total_memory_source"].startswith("PER GCD") else 1)
    assert 0.9 * per_device * GB <= row["total_memory_bytes"] <= per_device * GiB
    assert str(row["memory_gib_marketing"]) in row["name"]


def test_known_capacities() -> None:
    # H100 SXM 80GB: nvidia-smi prints 81559MiB, and torch's OOM message "total capacity of 79.19 GiB"
    # (torch.cuda.get_device_properties total_memory 85,029,158,912 on some drivers; the table stores the
    # deviceQuery figure 85,028,896,768 - both are 79.19 GiB to two decimals).
    h100 = resolve_gpu("h100")
    assert f"{h100.memory_bytes / GiB:.2f}" == "79.19" and RAW_BY_NAME[h100.name]["nvidia_smi_total_mib"] == 81559
    # A100 80GB: nvidia-smi prints 81920MiB = exactly 80 GiB = 85,899,345,920 bytes; CUDA reports less
    # (79.15 GiB in the cited vllm-project/vllm#4408 OOM message).
    a100 = resolve_gpu("a100-80gb")
    assert RAW_BY_NAME[a100.name]["nvidia_smi_total_mib"] * MiB == 80 * GiB == 85_899_345_920
    assert f"{a100.memory_bytes / GiB:.2f}" == "79.15"
    # 80GB-class boards: CUDA total within 1.5 % below 80 GiB.
    for gpu in gpu_table():
        if gpu.name.endswith("-80gb"):
            assert 0.985 * 80 * GiB <= gpu.memory_bytes < 80 * GiB, gpu.name


# ---- resolve_gpu ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu", gpu_table(), ids=NAMES)
def test_every_name_and_alias_resolves_case_insensitively(gpu: GpuSpec) -> None:
    for key in (gpu.name, *gpu.aliases):
        assert resolve_gpu(key) is gpu
        assert resolve_gpu(f"  {key.upper()} ") is gpu


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("h100-80gb", "h100-sxm-80gb"),  # the example in WORKLOAD.md
        ("H100", "h100-sxm-80gb"),
        ("a100", "a100-sxm-80gb"),
        ("a100-40gb", "a100-sxm-40gb"),
        ("4090", "rtx-4090-pcie-24gb"),  # an alias that starts with a digit is a GPU, not 4090 bytes
        ("RTX3090", "rtx-3090-pcie-24gb"),
        ("mi300x", "mi300x-oam-192gb"),
    ],
)
def test_common_names(text: str, name: str) -> None:
    assert resolve_gpu(text).name == name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GiB", 24 * GiB),
        ("80GB", 80 * GB),
        ("80 GB", 80 * GB),
        (" 16gib ", 16 * GiB),
        ("1.5TiB", 3 * 2**39),
        ("48000MiB", 48000 * MiB),
    ],
)
def test_plain_sizes_make_a_custom_gpu(text: str, expected: int) -> None:
    gpu = resolve_gpu(text)
    assert gpu.memory_bytes == expected and gpu.capacity_basis == "user size" and gpu.name == text.strip()
    assert gpu.memory_bandwidth_bytes_per_s is None and gpu.peak_dense_flops == {}


@pytest.mark.parametrize("text", ["80G", "24 g", "80T"])
def test_ambiguous_sizes_are_refused(text: str) -> None:
    message = error_for(text)
    assert message.startswith("gpu:") and "ambiguous" in message and "GiB" in message and "GB" in message


@pytest.mark.parametrize("text", ["0GiB", "0", "0.0GB"])
def test_zero_sizes_are_refused(text: str) -> None:
    assert error_for(text).startswith("gpu:")


@pytest.mark.parametrize("text", ["h1000", "a100-80", "rtx-4080", "tpu-v5", "", "  ", "-24GiB", "80 parsecs"])
def test_unknown_gpus_name_the_field_and_list_names(text: str) -> None:
    message = error_for(text)
    assert (message.startswith("gpu:") and repr(text) in message) or "'80 parsecs'" in message
    close = difflib.get_close_matches(text.strip().lower(), NAMES, n=1)
    assert all(name in message for name in close)


def test_unknown_gpu_message_lists_every_canonical_name_and_an_example_size() -> None:
    message = error_for("h1000")
    assert "24GiB" in message and all(name in message for name in NAMES)


def test_field_name_is_used_in_messages() -> None:
    assert error_for("h1000", field_name="--gpu").startswith("--gpu:")
    assert error_for("80G", field_name="--gpu").startswith("--gpu:")


def test_gpu_table_does_not_import_torch() -> None:
    code = "import sys, vramlens.hardware as h; h.gpu_table(); h.resolve_gpu('h100'); assert 'torch' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]


# ---- names as nvidia-smi and torch print them; cards with the same memory -------------------------------


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("NVIDIA GeForce RTX 4090", "rtx-4090-pcie-24gb"),  # nvidia-smi / torch.cuda.get_device_name()
        ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
        ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("Tesla T4", "t4-pcie-16gb"),
        ("NVIDIA L40S", "l40s-pcie-48gb"),
        ("NVIDIA H20", "h20-sxm-96gb"),
        ("NVIDIA GeForce RTX 5080", "rtx-5080-pcie-16gb"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000-blackwell-96gb"),
        ("AMD Instinct MI325X", "mi325x-oam-256gb"),
        ("nvidia_geforce_rtx_3090", "rtx-3090-pcie-24gb"),
        ("GeForce RTX 5090", "rtx-5090-pcie-32gb"),
    ],
)
def test_names_as_nvidia_smi_and_torch_print_them(text: str, name: str) -> None:
    assert resolve_gpu(text).name == name


def test_current_cards_are_in_the_table() -> None:
    for name in ("rtx-5090-pcie-32gb", "rtx-5080-pcie-16gb", "b200-sxm-180gb", "gb200-superchip-186gb", "h20-sxm-96gb",
                 "l40s-pcie-48gb", "mi300x-oam-192gb", "mi325x-oam-256gb", "rtx-pro-6000-blackwell-96gb"):  # fmt: skip
        assert name in NAMES


def test_same_memory_lists_cards_sold_with_that_size() -> None:
    from vramlens.hardware import same_memory

    assert [g.name for g in same_memory(resolve_gpu("NVIDIA GeForce RTX 4090"))] == [
        "rtx-3090-pcie-24gb", "a10g-pcie-24gb", "l4-pcie-24gb", "a10-pcie-24gb"]  # fmt: skip
    assert {g.name for g in same_memory(resolve_gpu("80GiB"))} == {
        "h100-sxm-80gb", "h100-pcie-80gb", "a100-sxm-80gb", "a100-pcie-80gb"}  # fmt: skip


def test_an_unknown_name_with_a_size_suggests_cards_with_that_memory() -> None:
    message = error_for("NVIDIA A100-PCIE-40GB")
    assert "cards sold with 40 GB: a100-sxm-40gb (or give the size, '40GB')" in message
