"""What a training forward's KV cache keeps beside autograd's saved tensors.

The text models of some multimodal wrappers (:attr:`~vramlens.resolve.styles.HfStyle.training_cache`)
fill a ``DynamicCache`` in training even under HF Trainer's ``use_cache=False``, which Trainer sets on
the wrapper's config only. Units: bytes per token of one layer.
"""

from __future__ import annotations

from vramlens.estimator.saved_parts import FP32, LayerRecipe, Part
from vramlens.model.spec import LayerKind
from vramlens.workload.options import AttentionImpl

__all__ = ["training_cache_parts"]


def training_cache_parts(recipe: LayerRecipe, kind: LayerKind) -> list[Part]:
    """What a training forward's KV cache (:attr:`LayerRecipe.training_cache`) keeps of one layer
    beyond autograd's saved tensors, bytes per token.

    The cache concatenates each layer's rotated keys and its values into new tensors and hands
    those to the attention (a sliding-window layer keeps a view of the last ``window - 1``
    positions, which holds the whole concatenation). A kernel that keeps the very tensors it was
    given (SDPA without a mask, flash) adds nothing. One that repeats them to every head (masked
    SDPA, eager attention with grouped keys) keeps the repeated copies, and the cache alone keeps
    the concatenation; so does autocast's bf16 copy of an fp32 cache. Under autocast with an fp32
    residual stream the rotated keys are fp32 (the rotary tables take the stream's dtype) and the
    cache starts both of its tensors empty in the keys' dtype, so ``cat`` promotes the bf16 values
    to fp32 too. Source: transformers 5.x cache_utils.py (``DynamicLayer.lazy_initialization``
    and ``update``, ``DynamicSlidingWindowLayer.update``); Qwen2.5-VL traced by the recipe tracer
    in bf16 and mixed precision, SDPA and eager, full and sliding layers (tests/simulator/test_recipe.py)."""
    spec, a = recipe.spec, recipe.compute_bytes
    if not (recipe.training_cache and kind.attends) or spec.attn.mla is not None:
        return []
    masked = (kind.sliding or recipe.style.sdpa_mask) and recipe.attention is not AttentionImpl.FLASH
    repeats = (recipe.eager_like(sliding=kind.sliding) or masked) and spec.num_heads != spec.num_kv_heads
    cache_bytes = FP32 if recipe.autocast else a
    if not repeats and cache_bytes == a:
        return []
    cached = cache_bytes * 2 * spec.num_kv_heads * spec.head_dim
    return [
        Part(name="KV cache of the training forward (keys and values the kernel does not keep)", bytes_per_token=cached)
    ]
