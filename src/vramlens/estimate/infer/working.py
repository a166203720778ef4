"""Activation working memory of one inference forward step (nothing is kept for backward).

Only one layer's intermediates are alive at a time, beside the residual stream.
Units: bytes on one rank; ``tokens`` = all tokens of the step (batch x new tokens).

* transformers (eager PyTorch modules): the residual and the normed input
  (``2 t h``) stay alive through the layer; attention holds q, k, v and the
  rotary copies of q and k, then the attention output and the o_proj output; a
  gated MLP holds ``act(gate)``, ``up`` and their product (``3 t i``), a plain
  MLP the fc1 output and its activation (``2 t i``). Eager attention adds the
  ``b x heads x s x s`` scores in the compute dtype, their float32 softmax and the
  cast back, plus the additive mask (``b x s x s``). Source: the Llama/Qwen2
  attention and MLP forward in transformers (modeling_llama.py).
* vLLM: hidden state and residual (``2 t h``); a fused qkv projection and the
  attention output; the merged gate_up output and ``SiluAndMul`` (``3 t i``); MoE
  layers through fused_moe's three intermediate caches (``t k (2i + i + h)``).
  Source: vllm/model_executor/models/llama.py, layers/fused_moe/fused_moe.py.

MoE layers in transformers loop over experts; the largest expert batch is taken as
the evenly routed share ``t k / E``, beside the float32 router logits and softmax.
"""

from __future__ import annotations

import math

from vramlens.estimate.infer.engines import sampler_bytes_per_logit
from vramlens.estimate.infer.kv_cache import kv_heads_per_rank
from vramlens.model.components import MlpKind
from vramlens.model.spec import ModelSpec
from vramlens.workload.options import AttentionImpl

__all__ = [
    "eager_scores_bytes",
    "hf_layer_working_bytes",
    "logits_bytes",
    "sampler_bytes",
    "vllm_layer_working_bytes",
]


def _attention_elements(spec: ModelSpec, tokens: int, tp: int, *, fused_qkv: bool) -> int:
    """Elements of attention intermediates per step (q/k/v, rotary copies, outputs)."""
    attention = spec.attention
    heads = attention.num_heads // tp
    mla = attention.mla
    if mla is not None:
        per_token = heads * (2 * mla.qk_head_dim + mla.qk_nope_head_dim + 2 * mla.v_head_dim)
        return tokens * (per_token + mla.kv_lora_rank + mla.qk_rope_head_dim + spec.hidden_size)
    kv = kv_heads_per_rank(attention.num_kv_heads, tp)
    hd = attention.head_dim
    if fused_qkv:  # qkv buffer (rotary applied in place) + attention output + o_proj output
        return tokens * (hd * (2 * heads + 2 * kv) + spec.hidden_size)
    return tokens * (hd * (2 * heads + 3 * kv) + spec.hidden_size)


def eager_scores_bytes(spec: ModelSpec, *, batch: int, seq_q: int, seq_kv: int, compute_bytes: int, tp: int) -> int:
    """Eager attention's score matrix: scores (compute dtype), float32 softmax, cast back, mask.

    Units: bytes. ``batch x heads/tp x seq_q x seq_kv x (2 c + 4)`` plus the mask ``batch x seq_q x seq_kv x c``.
    """
    heads = spec.num_heads // tp
    return batch * seq_q * seq_kv * (heads * (2 * compute_bytes + 4) + compute_bytes)


def _mlp_elements(spec: ModelSpec, tokens: int, tp: int, *, moe_layer: bool, fused: bool) -> int:
    moe = spec.moe
    if moe_layer and moe is not None:
        k, experts, inner = moe.experts_per_token, moe.num_experts, moe.expert_intermediate_size // tp
        shared = 3 * tokens * moe.shared_intermediate_size // tp
        if fused:  # fused_moe intermediate caches over all routed (token, expert) pairs
            return tokens * experts + tokens * k * (3 * inner + spec.hidden_size) + shared
        share = math.ceil(tokens * k / experts)
        router = 5 * tokens * experts  # logits, float32 softmax and top-k weights (~5 bf16 elements)
        return router + tokens * spec.hidden_size + share * (3 * inner + spec.hidden_size) + shared
    assert spec.mlp is not None
    width = 2 if spec.mlp.kind is MlpKind.PLAIN else 3
    return width * tokens * spec.mlp.intermediate_size // tp


def hf_layer_working_bytes(
    spec: ModelSpec,
    *,
    batch: int,
    seq_q: int,
    seq_kv: int,
    attention: AttentionImpl,
    compute_bytes: int,
    tp: int = 1,
) -> int:
    """Peak intermediates of one transformers decoder layer for ``batch x seq_q`` new tokens
    attending to ``seq_kv`` tokens (the largest of its attention and MLP working sets)."""
    tokens = batch * seq_q
    residual = 2 * tokens * spec.hidden_size
    attn = _attention_elements(spec, tokens, tp, fused_qkv=False) * compute_bytes
    if attention is AttentionImpl.EAGER:
        attn += eager_scores_bytes(spec, batch=batch, seq_q=seq_q, seq_kv=seq_kv, compute_bytes=compute_bytes, tp=tp)
    kinds = {layer.moe for layer in spec.layers}
    mlp = max(_mlp_elements(spec, tokens, tp, moe_layer=moe, fused=False) for moe in kinds) * compute_bytes
    return residual * compute_bytes + max(attn, mlp)


def vllm_layer_working_bytes(spec: ModelSpec, *, tokens: int, compute_bytes: int, tp: int = 1) -> int:
    """Peak intermediates of one vLLM decoder layer over a step of ``tokens`` tokens."""
    residual = 2 * tokens * spec.hidden_size
    attn = _attention_elements(spec, tokens, tp, fused_qkv=True)
    kinds = {layer.moe for layer in spec.layers}
    mlp = max(_mlp_elements(spec, tokens, tp, moe_layer=moe, fused=True) for moe in kinds)
    return (residual + max(attn, mlp)) * compute_bytes


def logits_bytes(spec: ModelSpec, *, rows: int, compute_bytes: int) -> int:
    """LM head output for ``rows`` positions and its float32 copy for sampling: ``rows x V x (c + 4)``."""
    return rows * spec.vocab_size * (compute_bytes + 4)


def sampler_bytes(spec: ModelSpec, *, rows: int, compute_bytes: int) -> int:
    """vLLM's sampler high point over ``rows`` sequences (engines.SAMPLER_TENSORS per logit)."""
    return rows * spec.vocab_size * sampler_bytes_per_logit(compute_bytes)
