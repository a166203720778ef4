"""model/safetensors.py: exact totals from headers; one-line errors naming the file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from conftest import HAVE_TRANSFORMERS, tiny_llama_config, write_safetensors
from vramlens.errors import CheckpointError
from vramlens.model.families import parse_config
from vramlens.model.resolve import load_model
from vramlens.model.safetensors import read_checkpoint, read_safetensors_header


def tiny_llama_tensors(config: dict, dtype: str = "BF16") -> dict[str, tuple[str, list[int]]]:
    """HF tensor names and shapes of a Llama checkpoint (no lm_head when tied)."""
    h, i, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * h // config["num_attention_heads"]
    tensors = {"model.embed_tokens.weight": (dtype, [V, h]), "model.norm.weight": ("F32", [h])}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        tensors |= {
            prefix + "self_attn.q_proj.weight": (dtype, [h, h]),
            prefix + "self_attn.k_proj.weight": (dtype, [kv, h]),
            prefix + "self_attn.v_proj.weight": (dtype, [kv, h]),
            prefix + "self_attn.o_proj.weight": (dtype, [h, h]),
            prefix + "mlp.gate_proj.weight": (dtype, [i, h]),
            prefix + "mlp.up_proj.weight": (dtype, [i, h]),
            prefix + "mlp.down_proj.weight": (dtype, [h, i]),
            prefix + "input_layernorm.weight": ("F32", [h]),
            prefix + "post_attention_layernorm.weight": ("F32", [h]),
        }
    if not config.get("tie_word_embeddings", False):
        tensors["lm_head.weight"] = (dtype, [V, h])
    return tensors


def write_sharded(directory: Path, tensors: dict[str, tuple[str, list[int]]], shards: int) -> None:
    names = list(tensors)
    weight_map = {}
    total = 0
    for index in range(shards):
        part = names[index::shards]
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        total += write_safetensors(directory / file, {n: tensors[n] for n in part}, {"format": "pt"})
        weight_map |= {n: file for n in part}
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )


def test_single_file_exact_counts_and_bytes(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(
        path,
        {"a": ("BF16", [3, 5]), "b": ("F32", [7]), "c": ("I8", [2, 2, 2]), "d": ("F8_E4M3", [10]), "s": ("F32", [])},
    )
    summary = read_checkpoint(path)
    assert summary.num_tensors == 5
    assert summary.elements_by_dtype == {"BF16": 15, "F32": 8, "F8_E4M3": 10, "I8": 8}
    assert summary.bytes_by_dtype == {"BF16": 30, "F32": 32, "F8_E4M3": 10, "I8": 8}
    assert summary.total_elements == 41 and summary.total_bytes == 80


def test_sharded_tied_checkpoint_matches_model_spec(tmp_path: Path) -> None:
    config = tiny_llama_config(tie_word_embeddings=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = tiny_llama_tensors(config)
    write_sharded(tmp_path, tensors, shards=3)
    spec = load_model(tmp_path)
    assert spec.checkpoint is not None
    assert len(spec.checkpoint.files) == 3
    assert "lm_head.weight" not in {t.name for t in spec.checkpoint.tensors}  # tied: stored once
    assert spec.checkpoint.total_elements == spec.num_parameters == parse_config(config).num_parameters
    norms = 2 * 2 * 64 + 64
    assert spec.checkpoint.bytes_by_dtype == {"BF16": 2 * (spec.num_parameters - norms), "F32": 4 * norms}
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert spec.checkpoint.total_bytes == index["metadata"]["total_size"]


def test_index_path_and_safetensors_file_paths(tmp_path: Path) -> None:
    config = tiny_llama_config()
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_sharded(tmp_path, tiny_llama_tensors(config), shards=2)
    via_index = load_model(tmp_path / "model.safetensors.index.json")
    assert via_index.checkpoint is not None and via_index.checkpoint.total_elements == via_index.num_parameters
    one = load_model(tmp_path / "model-00001-of-00002.safetensors")
    assert one.checkpoint is not None and one.checkpoint.total_elements < one.num_parameters


@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="needs torch + safetensors")
def test_files_written_by_the_safetensors_library(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    tensors = {
        "w": torch.zeros(4, 6, dtype=torch.bfloat16),
        "b": torch.zeros(6, dtype=torch.float32),
        "q": torch.zeros(3, 8, dtype=torch.int32),
    }
    save_file(tensors, str(tmp_path / "x.safetensors"), metadata={"format": "pt"})
    summary = read_checkpoint(tmp_path / "x.safetensors")
    assert summary.elements_by_dtype == {"BF16": 24, "F32": 6, "I32": 24}
    assert summary.bytes_by_dtype == {"BF16": 48, "F32": 24, "I32": 96}
    assert summary.metadata == {"format": "pt"}


def _raw(header: object, data: int = 0) -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + b"\0" * data


def _corrupt(tmp_path: Path, payload: bytes) -> Path:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(payload)
    return path


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"\x01\x02", "truncated safetensors file"),
        (struct.pack("<Q", 500) + b"{}", "truncated safetensors header: declares 500 bytes"),
        (struct.pack("<Q", 2**60), "exceeds"),
        (struct.pack("<Q", 5) + b"{nope", "invalid JSON"),
        (struct.pack("<Q", 2) + b"[]", "expected a JSON object"),
        (_raw({"t": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, 1), "unknown dtype 'Q7'"),
        (_raw({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 8), "do not lie within the 8 data bytes"),
        (
            _raw({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, 8),
            "8 bytes stored but shape [4] of F32 needs 16",
        ),
        (
            _raw({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}),
            "shape must be a list of non-negative integers",
        ),
        (_raw({"t": "x"}), "expected an object with dtype"),
        (_raw({"__metadata__": {"a": 1}}), "__metadata__ must map strings to strings"),
    ],
)
def test_truncated_or_corrupt_headers_name_the_file(tmp_path: Path, payload: bytes, expected: str) -> None:
    path = _corrupt(tmp_path, payload)
    with pytest.raises(CheckpointError) as info:
        read_safetensors_header(path)
    message = str(info.value)
    assert message.startswith(str(path)) and expected in message and "\n" not in message


def test_truncating_a_real_file_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"a": ("F32", [100])})
    data = path.read_bytes()
    for cut in (4, 20, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=r"truncated|within"):
            read_checkpoint(path)


def test_index_problems(tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "missing.safetensors"}}))
    with pytest.raises(CheckpointError, match=r"shard 'missing\.safetensors' listed in weight_map is missing"):
        read_checkpoint(tmp_path)
    write_safetensors(tmp_path / "s.safetensors", {"b": ("F32", [1])})
    index.write_text(json.dumps({"weight_map": {"a": "s.safetensors"}}))
    with pytest.raises(
        CheckpointError,
        match=r"s\.safetensors: tensor 'a' listed in model\.safetensors\.index\.json is not in this shard",
    ):
        read_checkpoint(tmp_path)
    index.write_text(json.dumps({"weight_map": {"a": "../etc/passwd"}}))
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        read_checkpoint(tmp_path)
    index.write_text("{not json")
    with pytest.raises(CheckpointError, match="invalid JSON"):
        read_checkpoint(tmp_path)
