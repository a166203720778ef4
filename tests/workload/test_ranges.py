"""Every numeric workload key has one range (``vramlens.workload.ranges.RANGES``) that the
loader, the dataclasses, the web schema, the CLI help and ``docs/limits.md`` all use."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from vramlens._files import files_markdown
from vramlens.errors import InputError
from vramlens.workload import load_workload
from vramlens.workload.load import LORA_KEYS, PARALLEL_KEYS, TOP_KEYS
from vramlens.workload.ranges import MAX_BATCH_TOKENS, RANGES, NumberRange, ranges_markdown

DOCS = Path(__file__).resolve().parents[2] / "docs" / "limits.md"
MODEL = "llama-3.1-8b"
#: A workload in which each key can take its extreme values (inference for the token keys).
CONTEXTS: dict[str, dict[str, Any]] = {
    "prompt": {"mode": "infer", "batch": 1, "allow_long_context": True},
    "generate": {"mode": "infer", "batch": 1, "allow_long_context": True},
    "context": {"mode": "infer", "batch": 1, "allow_long_context": True},
    "seq": {"batch": 1, "allow_long_context": True},
    "batch": {"seq": 64},
}


def _workload(key: str, value: Any) -> dict[str, Any]:
    block, _, leaf = key.rpartition(".")
    data: dict[str, Any] = {"model": MODEL, **CONTEXTS.get(key, {})}
    if block:
        data[block] = {leaf: value}
        if block == "parallel" and (leaf in ("reduce_bucket_size", "sub_group_size") or leaf.startswith("stage3_")):
            data["parallel"] |= {"gpus": 2, "shard": "zero3"}  # DeepSpeed ZeRO's sizes
        elif block == "parallel" and leaf != "gpus":
            gpus = value if isinstance(value, int) and 1 <= value <= 2**20 else 1
            data["parallel"] |= {"gpus": gpus, "shard": "fsdp"}
    else:
        data[key] = value
    return data


def test_the_docs_hold_the_tables_of_the_code() -> None:
    text = DOCS.read_text()
    assert ranges_markdown() in text
    assert files_markdown() in text


def test_every_numeric_key_has_a_range() -> None:
    numeric = {"batch", "seq", "grad_accum", "recompute_every", "prompt", "generate", "context", "max_num_seqs",
               "block_size", "max_num_batched_tokens", "gpu_memory_utilization", "moe_capacity_factor"}  # fmt: skip
    expected = numeric | {f"lora.{k}" for k in ("rank", "alpha", "dropout")}
    expected |= {f"parallel.{k}" for k in ("gpus", "tp", "pp", "cp", "ep", "shard_degree", "reduce_bucket_size")}
    expected |= {f"parallel.stage3_{k}" for k in ("prefetch_bucket_size", "max_live_parameters", "max_reuse_distance")}
    expected |= {"parallel.stage3_param_persistence_threshold", "parallel.sub_group_size"}
    assert set(RANGES) == expected
    assert numeric <= set(TOP_KEYS) and {"rank", "alpha", "dropout"} <= set(LORA_KEYS) and "tp" in PARALLEL_KEYS


@pytest.mark.parametrize("key", sorted(RANGES))
def test_each_range_is_what_the_loader_accepts(key: str) -> None:
    bounds = RANGES[key]
    integer = key not in ("gpu_memory_utilization", "moe_capacity_factor", "lora.alpha", "lora.dropout")
    above = int(bounds.high) + 1 if integer else bounds.high * 1.5
    name = re.escape(key)
    with pytest.raises(InputError, match=rf"^{name}: must be an? .*<"):
        load_workload(_workload(key, above))
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(InputError, match=rf"^{name}: must be"):
            load_workload(_workload(key, bad))
    low = bounds.low if not bounds.low_open else bounds.low + 0.5
    if key not in ("parallel.shard_degree",):
        load_workload(_workload(key, int(low) if integer else low))


def test_two_large_keys_cannot_multiply_into_an_absurd_micro_batch() -> None:
    load_workload({"model": MODEL, "batch": 2**8, "seq": 2**24, "allow_long_context": True})
    with pytest.raises(InputError, match=r"^batch: .* more than the 4,294,967,296 \(2\*\*32\) accepted"):
        load_workload({"model": MODEL, "batch": 2**9, "seq": 2**24, "allow_long_context": True})
    assert MAX_BATCH_TOKENS == 2**32


def test_the_dataclasses_check_the_same_ranges() -> None:
    from vramlens.workload.spec import LoraConfig, Parallelism, Workload

    with pytest.raises(InputError, match=r"^batch: must be an integer <= 1,048,576"):
        Workload(model=MODEL, batch=10**18)
    with pytest.raises(InputError, match=r"^lora\.rank: must be an integer <= 65,536"):
        LoraConfig(rank=10**9)
    with pytest.raises(InputError, match=r"^parallel\.gpus: must be an integer <= 1,048,576"):
        Parallelism(gpus=2**21, shard=Parallelism().shard.__class__("fsdp"))
    with pytest.raises(InputError, match=r"^gpu_memory_utilization: must be a number >= 0\.01"):
        Workload(model=MODEL, gpu_memory_utilization=1e-300)


def test_the_web_schema_states_the_ranges() -> None:
    from vramlens.web.schema import WORKLOAD_SCHEMA

    properties = WORKLOAD_SCHEMA["properties"]
    batch = properties["batch"]
    assert (batch["minimum"], batch["maximum"]) == (1, 2**20)
    assert properties["lora"]["properties"]["alpha"]["exclusiveMinimum"] == 0
    assert properties["gpu_memory_utilization"]["maximum"] == 1.0
    seq = properties["seq"]["anyOf"][0]
    assert (seq["minimum"], seq["maximum"]) == (1, 2**24)


def test_the_cli_help_states_the_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    from vramlens.cli.app import main

    assert main(["estimate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "concurrent sequences (inference) (from 1 to 1,048,576)" in text
    assert "and a dropped copy) (>= 0 and < 1)" in text


def test_a_range_describes_itself() -> None:
    assert NumberRange(low=1, high=4096).describe() == "from 1 to 4,096"
    assert NumberRange(low=0, high=1, high_open=True).describe() == ">= 0 and < 1"
    assert not NumberRange(low=0, high=1).holds(math.nan)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("alloc_conf", "max_split_size_mb:" + "9" * 5000, "characters, more than the 1024 accepted"),
        ("alloc_conf", "max_split_size_mb:" + "9" * 30, "expects a non-negative integer below 2**64"),
        ("alloc_conf", "max_split_size_mb:\u0663\u0663", "expects a non-negative integer below 2**64"),
        ("alloc_conf", ["expandable_segments:True"], "must be a PYTORCH_CUDA_ALLOC_CONF string"),
        ("versions", {"transformers": "4." + "9" * 5000}, "versions.transformers: expected a quoted release number"),
        ("versions", {"transformers": "\u0664.\u0663\u0665"}, "versions.transformers: expected a quoted release"),
        ("versions", {"x" * 10_000: "4.35"}, "versions: unknown package 'xxxx"),
        ("versions", "transformers=" + "9" * 3000, "versions.transformers: expected a quoted release number"),
        ("versions", "transformers=" + "9" * 5000, "versions: 5,013 characters, more than the 4096 accepted"),
    ],
)
def test_the_string_keys_of_issue_20_are_bounded(key: str, value: Any, fragment: str) -> None:
    """Issue 21 applied to ``alloc_conf`` and ``versions``: huge or non-ASCII numbers are one-line
    errors (a 5,000-digit version made ``int()`` raise a bare ValueError), never a traceback."""
    with pytest.raises(InputError) as info:
        load_workload({"model": MODEL, key: value})
    message = str(info.value)
    assert fragment in message and "\n" not in message and len(message) <= 1000
