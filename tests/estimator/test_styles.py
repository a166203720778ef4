"""Every native family has its saved-tensor style; nothing falls back to another family's."""

from __future__ import annotations

import pytest

from vramlens.model import supported_model_types
from vramlens.resolve.styles import HF_STYLES, hf_style


def test_every_native_family_has_a_style() -> None:
    missing = set(supported_model_types()) - set(HF_STYLES)
    assert not missing, f"native families without a saved-tensor style: {sorted(missing)}"


def test_an_unknown_type_has_no_style_to_borrow() -> None:
    with pytest.raises(KeyError):
        hf_style("my_custom_llama")


def _cache_bytes(config: dict, **workload: object) -> float:
    """Bytes per token the training KV cache adds to layer 1 (sliding, masked SDPA) of ``config``."""
    from vramlens.estimator.recompute import layer_kind, layer_recipe, train_state
    from vramlens.estimator.training_cache import training_cache_parts
    from vramlens.model.resolve import model_from_config
    from vramlens.resolve.context import resolve_training
    from vramlens.workload.load import load_workload

    spec = model_from_config(config, name="tiny")
    ctx = resolve_training(spec, load_workload({"model": spec, "batch": 2, "seq": 64, "precision": "bf16", **workload}))
    recipe = layer_recipe(ctx, train_state(ctx, frozenset()), [])
    return sum(p.bytes_per_token for p in training_cache_parts(recipe, layer_kind(spec.layers[1], 64)))


def test_the_training_kv_cache_follows_the_text_config_and_checkpointing() -> None:
    """Qwen2.5-VL's text model takes ``use_cache`` from its own config (Trainer sets the wrapper's):
    a sliding layer's cache keeps the keys and values SDPA repeated (bf16: 2 x (32 + 32) B/token
    here); no cache when the config turns it off or under gradient checkpointing; Mistral 3 passes
    the wrapper's ``use_cache`` down (no cache)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
    from family_configs import FAMILY_CONFIGS

    flat = FAMILY_CONFIGS["qwen2_5_vl-flat-tied-sliding"]
    assert _cache_bytes(flat) == 2 * (32 + 32)
    assert _cache_bytes(flat, precision="mixed-bf16") == 4 * (32 + 32)  # fp32 keys; cat promotes the values
    assert _cache_bytes({**flat, "use_cache": False}) == 0
    assert _cache_bytes(flat, recompute="full") == 0
    assert not hf_style("mistral3").training_cache and hf_style("qwen2_5_vl").training_cache
