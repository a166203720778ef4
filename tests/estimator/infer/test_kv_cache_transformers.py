"""KV cache bytes equal what transformers' cache object holds, for native families with per-layer kinds.

Each tiny config (tests/model/family_configs.py) is built by transformers on fake tensors and run as
``generate()`` runs it: a prefill of the prompt with ``use_cache=True``, then one decode step. The
keys and values its ``DynamicCache`` holds are summed per storage (a sliding-window layer keeps a
view of the last ``window - 1`` positions, so right after the prefill the whole prompt's storage is
alive; after a decode step it holds ``window`` positions), and compared with the estimate's
``kv_cache`` at the prefill and decode phases. Every layer kind is covered: full and sliding
attention, NoPE layers (SmolLM3, Cohere2's global layers), sinks (gpt-oss), dense and MoE layers.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from conftest import requires_hf
from vramlens.categories import Category
from vramlens.estimator import estimate
from vramlens.model.resolve import model_from_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "model"))

from family_configs import FAMILY_CONFIGS

pytestmark = [requires_hf, pytest.mark.hf]

_BATCH, _PROMPT = 2, 40
_FAMILIES = [
    "gpt_oss",
    "gpt_oss-layer-types",
    "olmoe",
    "smollm3",
    "smollm3-nope-sliding",
    "cohere2",
    "glm4_moe",
    "glm4_moe-two-shared",
]


def transformers_cache_bytes(config: dict[str, Any], *, batch: int, prompt: int) -> tuple[int, int, int]:
    """(keys+values after the prefill, after one decode step, other tensors the cache holds), in bytes."""
    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    values = dict(config)
    hf_config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    hf_config._attn_implementation = "eager"  # every family has it; the cache does not depend on it
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    model.eval()
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        model.to_empty(device="cpu")
        ids = torch.randint(0, hf_config.vocab_size, (batch, prompt))
        cache = model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
        after_prefill, other = _held(cache)
        cache = model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True, logits_to_keep=1).past_key_values
        after_decode, _ = _held(cache)
    return after_prefill, after_decode, other


def _held(cache: Any) -> tuple[int, int]:
    """Bytes of the storages behind each layer's keys and values, and of its other tensors."""
    import torch

    kv: dict[int, int] = {}
    other = 0
    for layer in cache.layers:
        for name, value in vars(layer).items():
            if not isinstance(value, torch.Tensor):
                continue
            storage = value.untyped_storage()
            if name in ("keys", "values"):
                kv[storage._cdata] = storage.nbytes()
            else:
                other += storage.nbytes()
    return sum(kv.values()), other


def _kv(report: Any, phase: str) -> int:
    return int(next(p for p in report.phases if p.name == phase).breakdown[Category.KV_CACHE])


@pytest.mark.parametrize(
    "key", [pytest.param(key, marks=() if key == "gpt_oss" else (pytest.mark.slow,)) for key in _FAMILIES]
)
def test_kv_cache_equals_the_transformers_cache(key: str) -> None:
    config = FAMILY_CONFIGS[key]
    prefill, decode, other = transformers_cache_bytes(config, batch=_BATCH, prompt=_PROMPT)
    spec = model_from_config(config)
    report = estimate(
        {"model": spec, "mode": "infer", "batch": _BATCH, "prompt": _PROMPT, "generate": 1, "precision": "bf16"}
    )
    assert _kv(report, "prefill") == prefill
    assert _kv(report, "decode") == decode
    # Besides keys and values, a sliding-window layer holds its window as one int64 scalar.
    assert other == 8 * sum(1 for layer in spec.layers if layer.window is not None)


def test_sliding_layers_hold_less_than_full_ones_after_decode() -> None:
    """The test above would pass for a cache without windows only if no window were shorter than the
    context: the configs' windows (8 and 16) are, so the decode figure is window-capped."""
    spec = model_from_config(FAMILY_CONFIGS["gpt_oss"])
    assert {layer.window for layer in spec.layers} == {16, None}
    prefill, decode, _ = transformers_cache_bytes(FAMILY_CONFIGS["gpt_oss"], batch=_BATCH, prompt=_PROMPT)
    assert decode < prefill
