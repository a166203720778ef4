"""KV cache bytes against what transformers' cache object holds (the [hf] extra).

A tiny model of each family runs a real prefill on CPU with ``use_cache=True``, then one
decode step; the bytes of the storages behind the returned cache's tensors must equal
:func:`kv_cache_bytes` for the spec's layers: after the prefill every layer holds the
whole prompt (a sliding-window or chunked layer keeps a view of its last ``window - 1``
positions of the prompt's keys), after a decode step those layers hold their window or
attention chunk (Llama 4's chunked layers are cached like sliding ones, sized
``attention_chunk_size``), global layers every token.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from conftest import requires_hf
from vramlens.estimator.infer.kv_cache import kv_cache_bytes
from vramlens.model.resolve import model_from_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "model"))

from family_configs import FAMILY_CONFIGS

pytestmark = [requires_hf, pytest.mark.hf]

_BATCH, _PROMPT = 2, 40  # longer than the tiny configs' windows and chunks (16)
_FAMILIES = [
    "llama4_text",
    "llama4",
    "qwen2_5_vl",
    "qwen2_5_vl-flat-tied-sliding",
    "qwen3_vl",
    "qwen3_vl_moe",
    "mistral3",
    "mistral3-ministral3",
    "ministral3",
    "gemma3_text",
]


def _cache_bytes(cache: Any) -> int:
    from vramlens.simulator.infer import cache_tensors

    # Keys and values; a sliding layer also holds its window as a 0-d int64 tensor (8 bytes).
    kv = [t for t in cache_tensors(cache) if t.dim() == 4]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in kv}
    return sum(storages.values())


def _run(config: dict[str, Any]) -> tuple[int, int]:
    import torch
    import transformers

    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    image_text = transformers.models.auto.modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    auto = transformers.AutoModelForImageTextToText if config["model_type"] in image_text else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_config = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
        hf_config._attn_implementation = "sdpa"
        model = (auto or transformers.AutoModelForCausalLM).from_config(hf_config, dtype=torch.bfloat16)
    model.eval()
    vocab = model.config.get_text_config().vocab_size
    with torch.no_grad():
        ids = torch.randint(0, vocab, (_BATCH, _PROMPT))
        positions = torch.arange(_PROMPT).unsqueeze(0).expand(_BATCH, -1)
        cache = model(input_ids=ids, position_ids=positions, use_cache=True).past_key_values
        prefill = _cache_bytes(cache)
        step = torch.full((_BATCH, 1), _PROMPT)
        cache = model(input_ids=ids[:, -1:], position_ids=step, past_key_values=cache, use_cache=True).past_key_values
    return prefill, _cache_bytes(cache)


@pytest.mark.slow
@pytest.mark.parametrize("family", _FAMILIES)
def test_cache_bytes_equal_transformers_cache(family: str) -> None:
    config = FAMILY_CONFIGS[family]
    spec = model_from_config(config, name="tiny")
    prefill, decode = _run(config)
    unwindowed = [dataclasses.replace(layer, window=None, chunk=None) for layer in spec.layers]
    assert prefill == kv_cache_bytes(spec.attention, unwindowed, tokens=_PROMPT, sequences=_BATCH, kv_bytes=2)
    assert decode == kv_cache_bytes(spec.attention, spec.layers, tokens=_PROMPT + 1, sequences=_BATCH, kv_bytes=2)
    if any(layer.chunk or layer.window for layer in spec.layers):
        assert decode < kv_cache_bytes(spec.attention, unwindowed, tokens=_PROMPT + 1, sequences=_BATCH, kv_bytes=2)
