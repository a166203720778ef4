"""Fuzzing load_workload and read_workload_file: any input gives a Workload or a one-line InputError,
never another exception; valid workloads survive the workload_to_dict round trip."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramlens.errors import InputError
from vramlens.workload import Workload, load_workload, read_workload_file, workload_to_dict

MODEL = "llama-3.1-8b"

#: Valid values per key (names as in WORKLOAD.md), used to reach the deeper checks.
VALID: dict[str, list[Any]] = {
    "model": [MODEL, "gpt2"],
    "mode": ["train", "infer"],
    "gpu": ["h100-80gb", "24GiB", None],
    "framework": ["auto", "hf", "torchtitan", "megatron", "deepspeed"],
    "method": ["full", "lora", "qlora", "freeze"],
    "precision": ["fp32", "bf16", "mixed-bf16", "mixed-fp16"],
    "quant": ["none", "nf4", "int8", "fp8"],
    "float8": [True, False, "yes"],
    "optimizer": ["adamw", "adamw-8bit", "sgd", "lion"],
    "optimizer_impl": ["auto", "fused", "foreach"],
    "optimizer_in_backward": [True, False],
    "batch": [1, 4, "8"],
    "seq": [128, "8k", 2048],
    "grad_accum": [1, 8],
    "packing": [True, False],
    "recompute": ["none", "selective", "full", "offload"],
    "recompute_every": [1, 2],
    "attention": ["auto", "flash", "eager"],
    "loss": ["auto", "chunked", "fused-linear"],
    "compile": [True, False],
    "prompt": [1, "1k"],
    "generate": [0, 256],
    "context": [None, "4k"],
    "kv_dtype": ["auto", "fp8"],
    "engine": ["hf", "vllm"],
    "gpu_memory_utilization": [0.5, 1],
    "max_num_seqs": [1, 256],
    "block_size": [16, 32],
    "allow_long_context": [True, False],
}
VALID_LORA: dict[str, list[Any]] = {
    "rank": [1, 16],
    "alpha": [8, 32.0],
    "dropout": [0.0, 0.1],
    "targets": ["all-linear", ["q_proj", "v_proj"], "q_proj,k_proj"],
    "modules_to_save": [[], ["lm_head"]],
}
VALID_PARALLEL: dict[str, list[Any]] = {
    "gpus": [1, 2, 4, 8],
    "shard": ["none", "ddp", "zero1", "zero3", "fsdp", "hsdp"],
    "shard_degree": [None, 1, 2, 4],
    "tp": [1, 2],
    "pp": [1, 2],
    "pp_schedule": ["1f1b", "gpipe", "interleaved-1f1b"],
    "cp": [1, 2],
    "ep": [1, 2],
    "offload": ["none", "optimizer", "optimizer+params"],
}


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([2**63, -(2**63), 10**300, 10**400, -(10**400), 0, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["²", "①", "³k", "٣"]),
    st.sampled_from(["8k", "null", "true", "1_000", " 4 ", "-", "k", "all-linear", "0.5"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
random_keys = st.text(max_size=10)


def _mostly(valid: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Three draws in four from ``valid``, so most examples get past the first key to the deeper checks."""
    return st.sampled_from([True, True, True, False]).flatmap(lambda ok: valid if ok else other)


def _pairs(table: dict[str, list[Any]], value_for: Any) -> st.SearchStrategy[dict[Any, Any]]:
    names = sorted(table)
    known = st.sampled_from(names) | st.sampled_from([k.replace("_", "-") for k in names])
    known_pairs = known.flatmap(lambda k: st.tuples(st.just(k), value_for(k.replace("-", "_"))))
    stray = st.sampled_from([0, 0, 0, 1]).flatmap(
        lambda n: st.lists(st.tuples(random_keys, values), min_size=n, max_size=n)
    )
    return st.tuples(st.lists(known_pairs, max_size=8), stray).map(lambda p: dict(p[0] + p[1]))


def _block(table: dict[str, list[Any]]) -> st.SearchStrategy[Any]:
    return _mostly(_pairs(table, lambda k: _mostly(st.sampled_from(table[k]), values)), values)


def _value_for(key: str) -> st.SearchStrategy[Any]:
    if key == "lora":
        return _block(VALID_LORA)
    if key == "parallel":
        return _block(VALID_PARALLEL)
    return _mostly(st.sampled_from(VALID[key]), values)


top_level = _pairs({**VALID, "lora": [], "parallel": []}, _value_for)
workloads = st.tuples(
    _mostly(st.just({"model": MODEL}), st.just({}) | st.dictionaries(st.just("model"), values)), top_level
).map(lambda parts: {**parts[0], **parts[1]})


def _assert_one_line(error: InputError) -> None:
    message = str(error)
    assert message and "\n" not in message and "\r" not in message and len(message.splitlines()) == 1, message


@settings(max_examples=300, deadline=None)
@given(workloads, _mostly(st.none(), top_level))
def test_any_dict_gives_a_workload_or_a_one_line_input_error(data: dict[str, Any], overrides: Any) -> None:
    try:
        loaded = load_workload(data, overrides)
    except InputError as error:
        _assert_one_line(error)
    else:
        assert isinstance(loaded, Workload)


valid_workloads = st.fixed_dictionaries(
    {"model": st.just(MODEL)},
    optional={
        **{k: st.sampled_from(v) for k, v in VALID.items() if k != "model"},
        "lora": st.fixed_dictionaries({}, optional={k: st.sampled_from(v) for k, v in VALID_LORA.items()}),
        "parallel": st.fixed_dictionaries({}, optional={k: st.sampled_from(v) for k, v in VALID_PARALLEL.items()}),
    },
)


@settings(max_examples=300, deadline=None)
@given(valid_workloads)
def test_valid_values_round_trip(data: dict[str, Any]) -> None:
    try:
        loaded = load_workload(data)
    except InputError as error:  # cross-field rules (e.g. offload without sharding) may still refuse
        _assert_one_line(error)
        return
    normalized = workload_to_dict(loaded)
    assert load_workload(normalized) == loaded
    assert workload_to_dict(load_workload(normalized)) == normalized


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["run.yaml", "run.json"]), st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_file_gives_a_mapping_or_a_one_line_input_error(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    try:
        data = read_workload_file(path)
    except InputError as error:
        _assert_one_line(error)
        assert str(path) in str(error)
    else:
        assert isinstance(data, dict)


# ---- inputs that once escaped as other exceptions ------------------------------------------------


@pytest.mark.parametrize(("key", "text"), [("batch", "²"), ("parallel.gpus", "①"), ("seq", "³k"), ("seq", "٣")])
def test_non_ascii_digit_strings_are_input_errors(key: str, text: str) -> None:
    block, _, name = key.rpartition(".")
    data: dict[str, Any] = {"model": MODEL, **({block: {name: text}} if block else {key: text})}
    with pytest.raises(InputError, match=rf"^{key}:"):
        load_workload(data)


@pytest.mark.parametrize(
    "data",
    [
        {"gpu_memory_utilization": 10**400},
        {"lora": {"alpha": 10**400}},
        {"lora": {"dropout": -(10**400)}},
        {"lora": {"alpha": "1e999"}},
        {"lora": {"alpha": math.inf}},
    ],
)
def test_huge_ints_for_float_keys_are_input_errors(data: dict[str, Any]) -> None:
    with pytest.raises(InputError):
        load_workload({"model": MODEL, **data})


@pytest.mark.parametrize("value", [10**400, -(10**400), 2**1100])
@pytest.mark.parametrize("key", ["batch", "seq", "grad_accum"])
def test_ints_beyond_a_float_for_integer_keys_are_one_line_errors(key: str, value: int) -> None:
    """An int too large for a float (``math.isfinite`` raises OverflowError on it) is a
    one-line error naming the key, found by the fuzz above."""
    with pytest.raises(InputError, match=rf"^{key}: must be an integer"):
        load_workload({"model": MODEL, key: value})


def test_float_keys_reject_nan() -> None:
    for data in ({"gpu_memory_utilization": math.nan}, {"lora": {"alpha": "nan"}}):
        with pytest.raises(InputError):
            load_workload({"model": MODEL, **data})
