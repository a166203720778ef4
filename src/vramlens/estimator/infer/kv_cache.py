"""KV cache sizes: per token and layer, for every attention kind, then paged and windowed.

Per token and layer a cache stores (Units: elements; multiply by the KV dtype's bytes):

* MHA / GQA / MQA: one key and one value vector per KV head,
  ``2 x kv_heads x head_dim``. Under tensor parallelism each rank keeps
  ``kv_heads / tp`` heads, or one replicated head when tp exceeds the KV heads
  (vLLM and Megatron replicate them). Source: Pope et al., "Efficiently Scaling
  Transformer Inference" (arXiv 2211.05102) §2; Ainslie et al., "GQA" (arXiv 2305.13245).
* MLA stored as a latent (vLLM, SGLang): the compressed ``kv_lora_rank`` vector plus
  the shared rotary key ``qk_rope_head_dim``, the same on every TP rank.
  Source: DeepSeek-V2 report (arXiv 2405.04434) §2.1.2 "Low-Rank Key-Value Joint
  Compression" and Table 1 ((d_c + d_h^R) per token per layer).
* MLA in transformers: the decompressed keys (``heads x (nope + rope)``) and values
  (``heads x v_head_dim``), as its DeepSeek-V2/V3 attention caches them.

Only layers whose mixer attends keep keys and values (Mamba and linear-attention layers keep
a per-sequence state instead, :mod:`vramlens.estimator.infer.state_cache`).
Sliding-window layers keep at most ``window`` tokens (transformers' sliding-window
cache layers, vLLM's hybrid KV cache manager); chunked-attention layers (Llama 4) at most
``chunk`` tokens (transformers caches them in the same ``DynamicSlidingWindowLayer``, sized
``attention_chunk_size``: cache_utils.py ``get_layer_types_and_kwargs``); global layers keep
every token.
A paged cache (vLLM) allocates whole blocks of ``block_size`` tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from vramlens.model.components import AttentionSpec, LayerSpec

__all__ = [
    "cached_tokens",
    "kv_cache_bytes",
    "kv_elements_per_token",
    "kv_heads_per_rank",
    "layer_kv_limit",
    "paged_tokens",
]


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads one tensor-parallel rank holds: ``kv / tp``, or 1 (replicated) when tp > kv."""
    return max(1, num_kv_heads // tp)


def kv_elements_per_token(attention: AttentionSpec, *, tp: int = 1, latent: bool = False) -> int:
    """Cached elements per token in one layer on one rank (see the module docstring)."""
    mla = attention.mla
    if mla is not None and latent:
        return mla.kv_lora_rank + mla.qk_rope_head_dim
    if mla is not None:
        return attention.num_heads // tp * (mla.qk_head_dim + mla.v_head_dim)
    return 2 * kv_heads_per_rank(attention.num_kv_heads, tp) * attention.head_dim


def cached_tokens(tokens: int, window: int | None) -> int:
    """Tokens a layer keeps: all of them, or the last ``window`` for sliding-window layers."""
    return tokens if window is None else min(tokens, window)


def layer_kv_limit(layer: LayerSpec) -> int | None:
    """The most tokens a layer's cache keeps: its sliding window or attention chunk (None: all)."""
    return layer.window if layer.window is not None else layer.chunk


def paged_tokens(tokens: int, block_size: int | None) -> int:
    """Token slots allocated for ``tokens`` in whole blocks (``None``: no paging)."""
    if block_size is None or tokens == 0:
        return tokens
    return math.ceil(tokens / block_size) * block_size


def kv_cache_bytes(
    attention: AttentionSpec,
    layers: Sequence[LayerSpec],
    *,
    tokens: int,
    sequences: int,
    kv_bytes: int,
    tp: int = 1,
    latent: bool = False,
    block_size: int | None = None,
) -> int:
    """Bytes of the KV cache of ``sequences`` sequences of ``tokens`` tokens over ``layers`` on one rank.

    Units: bytes. Each layer keeps :func:`cached_tokens` (window-capped), rounded up to
    whole blocks when ``block_size`` is given, times :func:`kv_elements_per_token` x ``kv_bytes``.
    """
    per_token = kv_elements_per_token(attention, tp=tp, latent=latent) * kv_bytes
    slots = sum(
        paged_tokens(cached_tokens(tokens, layer_kv_limit(layer)), block_size) for layer in layers if layer.attends
    )
    return sequences * slots * per_token
