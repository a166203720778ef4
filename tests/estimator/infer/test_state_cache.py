"""Per-sequence caches of the hybrids: transformers' cache after a fake-tensor prefill holds exactly the
estimated keys/values and convolution/recurrent states; vLLM's hybrid page layout by hand."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from conftest import requires_hf
from vramlens.categories import Category
from vramlens.estimator import estimate
from vramlens.estimator.infer.kv_cache import kv_cache_bytes
from vramlens.estimator.infer.state_cache import hf_state_bytes, hybrid_pages, vllm_state_bytes
from vramlens.model.components import MixerKind
from vramlens.model.families import parse_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "model"))

from family_configs import HYBRID_CONFIGS

_BATCH, _PROMPT = 2, 37


def _prefill_cache_bytes(config: dict[str, Any], dtype: str) -> int:
    """Bytes of every tensor transformers' DynamicCache holds after a prefill of ``_BATCH x _PROMPT``
    tokens (one storage counted once): on fake tensors in bf16; fp32 runs the tiny model on CPU,
    since fake grouped matmuls take bf16 operands only."""
    import contextlib

    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vramlens.simulator.infer import cache_tensors

    options = {k: v for k, v in config.items() if k != "model_type"}
    mode = FakeTensorMode(allow_non_fake_inputs=True) if dtype == "bfloat16" else contextlib.nullcontext()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_config = transformers.AutoConfig.for_model(config["model_type"], **options)
        with mode:
            model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=getattr(torch, dtype)).eval()
            with torch.no_grad():
                ids = torch.randint(0, hf_config.vocab_size, (_BATCH, _PROMPT))
                cache = model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
            storages = {id(t.untyped_storage()): t.untyped_storage().nbytes() for t in cache_tensors(cache)}
    return sum(storages.values())


@requires_hf
@pytest.mark.hf
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("family", sorted(HYBRID_CONFIGS))
def test_the_cache_after_a_prefill_is_the_estimate(family: str, dtype: str) -> None:
    config = HYBRID_CONFIGS[family]
    spec = parse_config(config)
    element = 2 if dtype == "bfloat16" else 4
    attention = kv_cache_bytes(spec.attention, spec.layers, tokens=_PROMPT, sequences=_BATCH, kv_bytes=element)
    states = hf_state_bytes(spec, spec.layers, sequences=_BATCH, compute_bytes=element)
    assert states > 0
    assert _prefill_cache_bytes(config, dtype) == attention + states


def test_jamba_state_by_hand() -> None:
    # Jamba tiny: Mamba 1, d_inner = 2 x 64 = 128, d_state 8, d_conv 4; layers 1, 2, 4 are Mamba.
    # transformers: conv state 128 x 4 in bf16 + fp32 state 128 x 8, per sequence and layer.
    spec = parse_config(HYBRID_CONFIGS["jamba"])
    per_layer = 2 * 128 * 4 + 4 * 128 * 8
    assert hf_state_bytes(spec, spec.layers, sequences=3, compute_bytes=2) == 3 * 3 * per_layer
    # vLLM: d_conv - 1 positions and the state, both in the model dtype.
    assert vllm_state_bytes(spec, MixerKind.MAMBA, state_bytes=2) == 2 * (128 * 3 + 128 * 8)


def test_qwen3_next_gated_deltanet_state_by_hand() -> None:
    # 2 key heads x 16, 4 value heads x 8: conv over q, k, v = 2 x 32 + 32 = 96 channels x 4; the
    # recurrent state 4 x 16 x 8 (fp32 in transformers, the model dtype in vLLM).
    spec = parse_config(HYBRID_CONFIGS["qwen3_next"])
    linear = sum(1 for layer in spec.layers if layer.mixer is MixerKind.LINEAR_ATTENTION)
    assert linear == 3
    per_layer = 2 * 96 * 4 + 4 * 4 * 16 * 8
    assert hf_state_bytes(spec, spec.layers, sequences=1, compute_bytes=2) == linear * per_layer
    assert vllm_state_bytes(spec, MixerKind.LINEAR_ATTENTION, state_bytes=2, tp=2) == 2 * (48 * 3 + 2 * 16 * 8)


def test_vllm_raises_the_attention_block_so_a_page_holds_a_state() -> None:
    # Nemotron-H tiny: Mamba 2 state = conv (64 + 2 x 2 x 16) x 3 + 4 heads x 16 x 16 = 384 + 1024
    # elements = 2816 bytes in bf16; one attention layer keeps 2 x 2 x 16 x 2 = 128 bytes per token,
    # so the block is 16 x ceil(2816 / (16 x 128)) = 32 tokens and a page 4096 bytes. Two attention
    # and two Mamba layers: groups of 2, one attention group, one state group.
    spec = parse_config(HYBRID_CONFIGS["nemotron_h"])
    assert vllm_state_bytes(spec, MixerKind.MAMBA, state_bytes=2) == 2 * (128 * 3 + 4 * 16 * 16) == 2816
    pages = hybrid_pages(spec, spec.layers, kv_bytes=2, state_bytes=2, tp=1, block_size=16)
    assert (pages.block_size, pages.page_bytes, pages.group_size) == (32, 4096, 2)
    assert (pages.attention_groups, pages.state_groups) == ((None,), 1)
    assert pages.blocks_per_sequence(1000) == math.ceil(1000 / 32) + 1
    report = estimate(
        {"model": "llama-3.1-8b", "mode": "infer", "batch": 3, "prompt": 990, "generate": 10, "framework": "vllm"}
        | {"model": str(_write(spec.config))}
    )
    assert report.serving is not None
    assert report.serving.kv_bytes_needed == 3 * (32 + 1) * 2 * 4096
    assert any("attention blocks of 32 tokens (raised from block_size 16)" in note for note in report.assumptions)


def test_hf_generate_counts_states_in_the_kv_cache() -> None:
    config = HYBRID_CONFIGS["granitemoehybrid"]
    spec = parse_config(config)
    report = estimate({"model": str(_write(config)), "mode": "infer", "batch": 2, "prompt": 100, "generate": 20})
    decode = next(p for p in report.phases if p.name == "decode").breakdown
    attention = kv_cache_bytes(spec.attention, spec.layers, tokens=120, sequences=2, kv_bytes=2)
    assert decode[Category.KV_CACHE] == attention + hf_state_bytes(spec, spec.layers, sequences=2, compute_bytes=2)


_WRITTEN: dict[int, Path] = {}


def _write(config: Any) -> Path:
    """A model directory holding ``config`` as its config.json (the estimator reads models from files)."""
    import json
    import tempfile

    key = id(config)
    if key not in _WRITTEN:
        directory = Path(tempfile.mkdtemp(prefix="vramlens-hybrid-"))
        (directory / "config.json").write_text(json.dumps({**dict(config), "max_position_embeddings": 4096}))
        _WRITTEN[key] = directory
    return _WRITTEN[key]
