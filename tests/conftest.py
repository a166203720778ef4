"""Shared fixtures and helpers for the vramlens test suite."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
HAVE_TRANSFORMERS = (
    importlib.util.find_spec("transformers") is not None and importlib.util.find_spec("torch") is not None
)

requires_hf = pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="needs the [hf] extra (transformers + torch)")


@pytest.fixture(autouse=True, scope="session")
def _recipe_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Recipes derived by tests go to a temporary cache, never the user's ~/.cache (subprocesses
    started by tests inherit it)."""
    import os

    os.environ["VRAMLENS_CACHE_DIR"] = str(tmp_path_factory.mktemp("vramlens-cache"))


#: Bits per element of safetensors dtypes, written independently of vramlens' table.
_ST_BITS = {
    "F64": 64,
    "F32": 32,
    "F16": 16,
    "BF16": 16,
    "I64": 64,
    "I32": 32,
    "I16": 16,
    "I8": 8,
    "U8": 8,
    "BOOL": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
}


def write_safetensors(
    path: Path, tensors: dict[str, tuple[str, list[int]]], metadata: dict[str, str] | None = None
) -> int:
    """Write a valid safetensors file with zeroed data; returns the data bytes written.

    ``tensors`` maps names to (dtype, shape). Follows the published format: 8-byte
    little-endian header length, JSON header, then the tensors back to back.
    """
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        numel = 1
        for dim in shape:
            numel *= dim
        size = (numel * _ST_BITS[dtype] + 7) // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    if metadata is not None:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return offset


def tiny_llama_config(**overrides: Any) -> dict[str, Any]:
    """A small but complete Llama config (GQA, untied), for tests."""
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    return config


@pytest.fixture
def tiny_llama() -> dict[str, Any]:
    return tiny_llama_config()
