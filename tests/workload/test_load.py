"""load_workload / read_workload_file / workload_to_dict: strict parsing with one-line errors naming the key,
token counts, YAML/JSON files (safe loading), overrides and the normalized round trip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_spec import CONTRACT, CONTRACT_VALUES, CONTRACT_YAML

from vramlens.errors import InputError
from vramlens.model import load_model
from vramlens.workload import Shard, Workload, load_workload, read_workload_file, workload_to_dict
from vramlens.workload.keys import CONTRACT_V1, keys_of

MODEL = "llama-3.1-8b"


def error_for(source: Any, overrides: dict[str, Any] | None = None) -> str:
    with pytest.raises(InputError) as info:
        load_workload(source, overrides)
    message = str(info.value)
    assert "\n" not in message and "\r" not in message, message
    return message


# ---- token counts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "text", "expected"),
    [
        ("seq", "8k", 8192),
        ("seq", "8K", 8192),
        ("seq", " 32k ", 32768),
        ("seq", "2_048", 2048),
        ("seq", "4096", 4096),
        ("prompt", "1k", 1024),
        ("generate", "0", 0),
        ("context", "128k", 131072),
    ],
)
def test_token_counts_accept_k_suffix(key: str, text: str, expected: int) -> None:
    assert getattr(load_workload({"model": MODEL, key: text}), key) == expected


@pytest.mark.parametrize(
    ("key", "text"),
    [("seq", "8q"), ("seq", "1.5k"), ("seq", "k"), ("seq", "8kk"), ("seq", "-8k"), ("seq", "0k"), ("seq", "8 k")],
)
def test_bad_token_counts_name_the_key(key: str, text: str) -> None:
    assert error_for({"model": MODEL, key: text}).startswith(f"{key}:")


@pytest.mark.parametrize("key", ["batch", "grad_accum", "recompute_every", "max_num_seqs"])
def test_k_suffix_is_only_for_token_counts(key: str) -> None:
    assert error_for({"model": MODEL, key: "4k"}).startswith(f"{key}:")


# ---- unknown keys and values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("bach", "batch"),
        ("grad_acum", "grad_accum"),
        ("optimiser", "optimizer"),
        ("paralel", "parallel"),
        ("lroa", "lora"),
    ],
)
def test_unknown_top_level_key_suggests_the_closest(key: str, suggestion: str) -> None:
    message = error_for({"model": MODEL, key: 1})
    assert repr(key) in message and f"did you mean '{suggestion}'" in message


def test_unknown_key_without_a_close_match_lists_accepted_keys() -> None:
    message = error_for({"model": MODEL, "zzzzzz": 1})
    assert "'zzzzzz'" in message and "did you mean" not in message
    for key in ("model", "batch", "seq", "parallel", "lora", "block_size"):
        assert key in message


@pytest.mark.parametrize(
    ("block", "key", "suggestion"),
    [("parallel", "tpp", "tp"), ("parallel", "gpu", "gpus"), ("lora", "rnak", "rank"), ("lora", "target", "targets")],
)
def test_unknown_nested_key_names_block_and_key(block: str, key: str, suggestion: str) -> None:
    message = error_for({"model": MODEL, block: {key: 1}})
    assert message.startswith(f"{block}:") and repr(key) in message and f"did you mean '{suggestion}'" in message


def test_unknown_parallel_key_lists_the_parallel_keys() -> None:
    message = error_for({"model": MODEL, "parallel": {"foo": 1}})
    assert message.startswith("parallel:") and "'foo'" in message
    for key in ("gpus", "shard", "shard_degree", "tp", "pp", "pp_schedule", "cp", "ep", "offload"):
        assert key in message


@pytest.mark.parametrize(
    ("data", "key", "bad"),
    [
        ({"optimizer": "adamq"}, "optimizer", "adamq"),
        ({"precision": "fp12"}, "precision", "fp12"),
        ({"mode": "training"}, "mode", "training"),
        ({"method": "dora"}, "method", "dora"),
        ({"quant": "int4", "method": "qlora"}, "quant", "int4"),
        ({"recompute": "partial"}, "recompute", "partial"),
        ({"attention": "flash2"}, "attention", "flash2"),
        ({"framework": "jax"}, "framework", "jax"),
        ({"kv_dtype": "int8"}, "kv_dtype", "int8"),
        ({"engine": "sglang"}, "engine", "sglang"),
        ({"loss": "liger"}, "loss", "liger"),
        ({"optimizer_impl": "apex"}, "optimizer_impl", "apex"),
    ],
)
def test_unknown_enum_value_lists_documented_values(data: dict[str, Any], key: str, bad: str) -> None:
    message = error_for({"model": MODEL, **data})
    assert message.startswith(f"{key}:") and repr(bad) in message
    for accepted in CONTRACT_VALUES[key][1]:
        assert accepted in message


@pytest.mark.parametrize(
    ("parallel", "key", "accepted"),
    [
        ({"shard": "zero4"}, "parallel.shard", ["none", "ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp"]),
        ({"offload": "cpu"}, "parallel.offload", ["none", "optimizer", "optimizer+params"]),
        ({"pp_schedule": "zb-v"}, "parallel.pp_schedule", ["1f1b"]),
    ],
)
def test_unknown_parallel_value_names_the_dotted_key(parallel: dict[str, Any], key: str, accepted: list[str]) -> None:
    message = error_for({"model": MODEL, "parallel": parallel})
    assert message.startswith(f"{key}:") and all(value in message for value in accepted)


def test_values_and_keys_are_normalized() -> None:
    loaded = load_workload(
        {
            "model": MODEL,
            "optimizer": " AdamW ",
            "grad-accum": 2,
            "parallel": {"gpus": 4, "shard": "HSDP", "shard-degree": 2},
        }
    )
    assert (loaded.optimizer.value, loaded.grad_accum, loaded.parallel.shard, loaded.parallel.shard_degree) == (
        "adamw",
        2,
        Shard.HSDP,
        2,
    )


# ---- wrong types -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "key"),
    [
        *[({"batch": bad}, "batch") for bad in ("four", 0, -1, 2.5, True, None, [4], "2.0")],
        *[({"seq": bad}, "seq") for bad in (0, "0", -1, 2048.0, "2048 tokens")],
        ({"grad_accum": 0}, "grad_accum"),
        ({"recompute_every": 0}, "recompute_every"),
        ({"generate": -1}, "generate"),
        ({"context": 0}, "context"),
        *[({"gpu_memory_utilization": bad}, "gpu_memory_utilization") for bad in (0, 1.5, "high", float("nan"))],
        *[({"lora": {"rank": bad}}, "lora.rank") for bad in (0, -4, 2.5, "sixteen", False)],
        *[({"lora": {"alpha": bad}}, "lora.alpha") for bad in (0, -1, "x", None)],
        *[({"lora": {"dropout": bad}}, "lora.dropout") for bad in (1.0, -0.1, [0.1])],
        *[({"lora": {"targets": bad}}, "lora.targets") for bad in ([], [""], 5, [1], "", {"q": 1})],
        ({"lora": {"modules_to_save": 5}}, "lora.modules_to_save"),
        *[({"float8": bad}, "float8") for bad in ("maybe", 1, None, [])],
        ({"packing": "sometimes"}, "packing"),
        ({"compile": 0.0}, "compile"),
        ({"allow_long_context": "y"}, "allow_long_context"),
        *[({"parallel": {"gpus": bad}}, "parallel.gpus") for bad in (0, "8 gpus", 1.5)],
        ({"parallel": {"tp": -1}}, "parallel.tp"),
        ({"parallel": {"shard_degree": 0}}, "parallel.shard_degree"),
        *[({"parallel": bad}, "parallel") for bad in ([1], "fsdp", 8)],
        ({"lora": "yes"}, "lora"),
        ({"model": ""}, "model"),
        ({"model": 5}, "model"),
        ({"model": None}, "model"),
        ({"gpu": ""}, "gpu"),
        ({"gpu": 24}, "gpu"),
    ],
)
def test_wrong_types_are_one_line_errors_naming_the_key(data: dict[str, Any], key: str) -> None:
    assert error_for({"model": MODEL, **data}).startswith(f"{key}:")


@pytest.mark.parametrize(
    ("text", "expected"), [("true", True), ("Yes", True), ("1", True), ("false", False), ("no", False)]
)
def test_booleans_as_strings(text: str, expected: bool) -> None:
    assert load_workload({"model": MODEL, "packing": text}).packing is expected


def test_model_is_required() -> None:
    assert error_for({"batch": 4}).startswith("model:")


# ---- sources, files and overrides --------------------------------------------------------------------


def test_yaml_and_json_files_load(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text(CONTRACT_YAML)
    (tmp_path / "run.yml").write_text(CONTRACT_YAML)
    (tmp_path / "run.JSON").write_text(json.dumps(CONTRACT))
    expected = load_workload(CONTRACT)
    for name in ("run.yaml", "run.yml", "run.JSON"):
        assert load_workload(tmp_path / name) == expected
        assert load_workload(str(tmp_path / name)) == expected
    assert read_workload_file(tmp_path / "run.yaml") == CONTRACT


def test_overrides_win_and_nested_blocks_merge(tmp_path: Path) -> None:
    file_data = {
        "model": MODEL,
        "batch": 2,
        "grad_accum": 4,
        "parallel": {"gpus": 8, "shard": "fsdp", "tp": 2},
        "lora": {"rank": 8, "alpha": 16},
        "method": "lora",
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(file_data))
    overrides = {"batch": 8, "parallel": {"tp": 4}, "lora": {"rank": 32}, "grad-accum": 2}
    for source in (tmp_path / "run.yaml", file_data, load_workload(file_data)):
        loaded = load_workload(source, overrides)
        assert (loaded.batch, loaded.grad_accum) == (8, 2)
        assert (loaded.parallel.gpus, loaded.parallel.shard, loaded.parallel.tp) == (8, Shard.FSDP, 4)
        assert (loaded.lora.rank, loaded.lora.alpha) == (32, 16)


def test_overrides_are_validated_like_the_file(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text(f"model: {MODEL}\nparallel: {{gpus: 8, shard: fsdp}}\n")
    assert error_for(tmp_path / "run.yaml", {"parallel": {"tp": 3}}).startswith("parallel.gpus:")
    assert "did you mean 'batch'" in error_for(tmp_path / "run.yaml", {"bacth": 3})


def test_workload_source_is_reloaded_with_overrides() -> None:
    base = load_workload({"model": MODEL, "seq": "4k"})
    assert load_workload(base) == base
    assert load_workload(base, {"seq": 1024}).seq == 1024


@pytest.mark.parametrize(
    "tag",
    [
        '!!python/object/apply:os.system ["touch {marker}"]',
        "!!python/object/apply:subprocess.check_call [[touch, '{marker}']]",
        "!!python/name:os.system",
    ],
)
def test_yaml_python_tags_are_rejected_and_never_run(tmp_path: Path, tag: str) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(f"model: {tag.format(marker=marker)}\nbatch: 4\n")
    message = error_for(path)
    assert str(path) in message and "YAML" in message
    assert not marker.exists()


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("empty.yaml", "", "mapping"),
        ("list.yaml", "- model: llama-3.1-8b\n- batch: 4\n", "mapping"),
        ("scalar.yaml", "llama-3.1-8b\n", "mapping"),
        ("list.json", "[1, 2]", "mapping"),
        ("broken.yaml", "model: [llama\nbatch: 4\n", "invalid YAML"),
        ("tabs.yaml", "model: x\n\tbatch: 4\n", "invalid YAML"),
        ("broken.json", '{"model": "x",\n "batch": }', "invalid JSON"),
        ("latin1.yaml", b"model: caf\xe9\n", "UTF-8"),
        ("huge.yaml", "#" * (1 << 20) + "\n", "1 MiB"),
    ],
)
def test_bad_files_are_one_line_errors_naming_the_file(
    tmp_path: Path, name: str, content: str | bytes, fragment: str
) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    message = error_for(path)
    assert str(path) in message and fragment in message


@pytest.mark.parametrize("name", ["missing.yaml", "."])
def test_unreadable_paths_are_one_line_errors(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    assert str(path) in error_for(path)


def test_read_workload_file_does_not_validate(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text('{"model": "x", "whatever": [1, 2]}')
    assert read_workload_file(tmp_path / "run.json") == {"model": "x", "whatever": [1, 2]}


# ---- normalized round trip -----------------------------------------------------------------------------


ROUND_TRIPS = [
    {"model": MODEL},
    CONTRACT,
    {"model": MODEL, "method": "qlora", "quant": "nf4-dq", "lora": {"targets": ["q_proj", "v_proj"], "alpha": 8}},
    {"model": MODEL, "method": "freeze", "lora": {"modules_to_save": ["embed_tokens", "lm_head"]}},
    {"model": MODEL, "seq": "8k", "parallel": {"gpus": 16, "tp": 2, "shard": "hsdp", "shard_degree": 4}},
    {"model": MODEL, "mode": "infer", "context": "32k", "kv_dtype": "fp8", "engine": "vllm", "gpu": "24GiB"},
]


def plain(value: Any) -> bool:
    """Only exact JSON types (no tuples, no str-enums): what json.loads would give back."""
    if isinstance(value, dict):
        return all(type(k) is str and plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(plain(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


@pytest.mark.parametrize("data", ROUND_TRIPS)
def test_workload_to_dict_round_trips_through_json(data: dict[str, Any]) -> None:
    workload = load_workload(data)
    normalized = workload_to_dict(workload)
    assert json.loads(json.dumps(normalized)) == normalized and plain(normalized)
    assert load_workload(normalized) == workload
    assert load_workload(json.loads(json.dumps(normalized))) == workload
    assert workload_to_dict(load_workload(normalized)) == normalized


def test_normalized_dict_has_every_contract_key_with_its_default() -> None:
    normalized = workload_to_dict(load_workload({"model": MODEL}))
    added = {key.name: None for key in keys_of("parallel") if key.since != CONTRACT_V1}  # vramlens' own, all null
    for key, value in CONTRACT.items():
        expected = None if key == "gpu" else value  # gpu is optional: no GPU, no fit check
        assert normalized[key] == (expected | added if key == "parallel" else expected), key
    assert normalized["context"] is None and normalized["allow_long_context"] is False
    assert set(normalized["lora"]) == set(CONTRACT["lora"])
    assert set(normalized["parallel"]) == set(CONTRACT["parallel"]) | set(added)


def test_model_spec_is_reported_by_name() -> None:
    spec = load_model(MODEL)
    workload = load_workload({"model": spec, "batch": 2})
    assert workload.model is spec
    assert workload_to_dict(workload)["model"] == spec.name
    assert workload_to_dict(workload, keep_model_object=True)["model"] is spec
    assert load_workload(workload, {"batch": 3}) == Workload(model=spec, batch=3)


@pytest.mark.parametrize(("gpus", "shard"), [(1, "none"), (8, "ddp")])
def test_shard_degree_without_sharding_is_an_error(gpus: int, shard: str) -> None:
    """A shard group size means nothing without sharding: refused rather than ignored."""
    with pytest.raises(InputError, match=r"^parallel\.shard_degree: applies to sharded strategies"):
        load_workload({"model": "llama-3.1-8b", "parallel": {"gpus": gpus, "shard": shard, "shard_degree": 1}})


def test_gpu_is_checked_when_the_workload_is_loaded() -> None:
    with pytest.raises(InputError, match=r"^gpu: .*did you mean 'h100-sxm-80gb'"):
        load_workload({"model": "llama-3.1-8b", "gpu": "h100-sxm-80g"})
    with pytest.raises(InputError, match=r"^gpu: "):
        load_workload({"model": "llama-3.1-8b", "gpu": "80G"})
    assert load_workload({"model": "llama-3.1-8b", "gpu": "H100-80GB"}).gpu == "H100-80GB"
