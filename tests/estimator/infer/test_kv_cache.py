"""KV cache bytes per token, golden: each figure is worked out by hand from the model's config.json
(the verbatim copy in src/vramlens/model/catalog/<name>.json), then compared with
``kv_cache_bytes`` and with the ``serving`` section of the inference report."""

from __future__ import annotations

import math
from typing import Any

import pytest

from vramlens.estimator import estimate
from vramlens.estimator.infer.kv_cache import (
    cached_tokens,
    kv_cache_bytes,
    kv_elements_per_token,
    kv_heads_per_rank,
    paged_tokens,
)
from vramlens.model.resolve import load_model
from vramlens.result.report import ServingCapacity

BF16 = 2


def per_token(name: str, *, kv_bytes: int = BF16, tp: int = 1, latent: bool = False) -> int:
    """Bytes of one token of one sequence over all layers, straight from kv_cache_bytes."""
    spec = load_model(name)
    return kv_cache_bytes(spec.attention, spec.layers, tokens=1, sequences=1, kv_bytes=kv_bytes, tp=tp, latent=latent)


def serving(name: str, **workload: Any) -> ServingCapacity:
    report = estimate({"model": name, "mode": "infer", **workload})
    assert report.serving is not None
    return report.serving


# ---- GQA, explicit head_dim, MQA, MHA ----------------------------------------------------------


def test_llama_3_1_8b_gqa_per_token() -> None:
    # llama-3.1-8b.json: num_hidden_layers 32, num_key_value_heads 8, hidden_size 4096 /
    # num_attention_heads 32 = head_dim 128, torch_dtype bfloat16.
    # K and V x 8 KV heads x 128 x 2 bytes x 32 layers:
    expected = 2 * 8 * 128 * 2 * 32
    assert expected == 131_072
    assert per_token("llama-3.1-8b") == expected
    assert serving("llama-3.1-8b").kv_bytes_per_token == expected
    assert serving("llama-3.1-8b", engine="vllm").kv_bytes_per_token == expected


def test_qwen3_0_6b_uses_the_explicit_head_dim() -> None:
    # qwen3-0.6b.json: hidden_size 1024, num_attention_heads 16 (1024/16 = 64), but head_dim 128;
    # num_key_value_heads 8, num_hidden_layers 28. The cache uses head_dim 128, not 64:
    expected = 2 * 8 * 128 * 2 * 28
    assert expected == 114_688
    spec = load_model("qwen3-0.6b")
    assert spec.hidden_size // spec.num_heads == 64 and spec.attention.head_dim == 128
    assert per_token("qwen3-0.6b") == expected
    assert serving("qwen3-0.6b").kv_bytes_per_token == expected


def test_falcon_7b_mqa_per_token() -> None:
    # falcon-7b.json: multi_query true (one KV head), hidden_size 4544 / n_head 71 = head_dim 64, n_layer 32.
    expected = 2 * 1 * 64 * 2 * 32
    assert expected == 8_192
    assert per_token("falcon-7b") == expected
    assert serving("falcon-7b", prompt=512, generate=64).kv_bytes_per_token == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # gpt2.json: n_embd 768 (12 heads x 64, all of them cached: MHA), n_layer 12.
        pytest.param("gpt2", 2 * 768 * 2 * 12, id="gpt2"),
        # llama-2-7b.json: num_key_value_heads 32 = num_attention_heads, 4096/32 = 128, 32 layers.
        pytest.param("llama-2-7b", 2 * 32 * 128 * 2 * 32, id="llama-2-7b"),
    ],
)
def test_mha_per_token(name: str, expected: int) -> None:
    assert per_token(name) == expected
    assert serving(name, prompt=256, generate=64).kv_bytes_per_token == expected


def test_llama_2_7b_mha_is_4x_llama_3_gqa() -> None:
    # Same 32 layers x 32 heads x 128; 32 KV heads (MHA) against 8 (GQA).
    assert per_token("llama-2-7b") == 4 * per_token("llama-3.1-8b") == 524_288


# ---- sliding windows (Gemma 2) -----------------------------------------------------------------


def test_gemma_2_alternates_local_and_global_layers() -> None:
    spec = load_model("gemma-2-9b-it")
    windows = [layer.window for layer in spec.layers]
    assert windows[:4] == [4096, None, 4096, None]
    assert windows.count(4096) == windows.count(None) == 21


def test_gemma_2_9b_local_layers_keep_the_window() -> None:
    # gemma-2-9b-it.json: num_hidden_layers 42 (21 sliding, 21 global), num_key_value_heads 8,
    # head_dim 256, sliding_window 4096. Per layer and token: 2 x 8 x 256 x 2 B = 8192 B.
    layer_token = 2 * 8 * 256 * 2
    expected = 21 * 8192 * layer_token + 21 * 4096 * layer_token  # global: all 8192, local: 4096
    assert expected == 2_113_929_216
    spec = load_model("gemma-2-9b-it")
    got = kv_cache_bytes(spec.attention, spec.layers, tokens=8192, sequences=1, kv_bytes=BF16)
    assert got == expected
    assert serving("gemma-2-9b-it", context=8192, batch=1).kv_bytes_needed == expected


def test_gemma_2_9b_below_the_window_every_layer_keeps_every_token() -> None:
    spec = load_model("gemma-2-9b-it")
    layer_token = 2 * 8 * 256 * 2
    got = kv_cache_bytes(spec.attention, spec.layers, tokens=2048, sequences=3, kv_bytes=BF16)
    assert got == 3 * 42 * 2048 * layer_token
    assert per_token("gemma-2-9b-it") == 42 * layer_token


def test_cached_tokens() -> None:
    assert cached_tokens(8192, None) == 8192
    assert cached_tokens(8192, 4096) == 4096
    assert cached_tokens(100, 4096) == 100


# ---- MLA (DeepSeek-V3) -------------------------------------------------------------------------


def test_deepseek_v3_latent_cache_vllm() -> None:
    # deepseek-v3.json: kv_lora_rank 512, qk_rope_head_dim 64, num_hidden_layers 61.
    # vLLM caches the compressed latent plus the shared rotary key per layer:
    expected = (512 + 64) * 2 * 61
    assert expected == 70_272
    assert per_token("deepseek-v3", latent=True) == expected
    assert serving("deepseek-v3", engine="vllm", prompt=512, generate=64).kv_bytes_per_token == expected


def test_deepseek_v3_transformers_caches_decompressed_heads() -> None:
    # deepseek-v3.json: num_attention_heads 128, qk_nope_head_dim 128 + qk_rope_head_dim 64 = 192 for
    # keys, v_head_dim 128 for values: 128 x (192 + 128) elements per layer.
    spec = load_model("deepseek-v3")
    assert kv_elements_per_token(spec.attention) == 128 * (192 + 128) == 40_960
    expected = 128 * (192 + 128) * 2 * 61
    assert per_token("deepseek-v3") == expected
    assert serving("deepseek-v3", engine="hf", prompt=512, generate=64).kv_bytes_per_token == expected


def test_deepseek_v3_under_tp_latent_is_replicated_heads_are_split() -> None:
    spec = load_model("deepseek-v3")
    assert kv_elements_per_token(spec.attention, tp=8, latent=True) == 512 + 64
    assert kv_elements_per_token(spec.attention, tp=8) == 128 // 8 * (192 + 128)
    assert per_token("deepseek-v3", tp=8, latent=True) == per_token("deepseek-v3", latent=True)
    assert per_token("deepseek-v3", tp=8) * 8 == per_token("deepseek-v3")


# ---- tensor parallelism ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kv_heads", "tp", "per_rank"),
    [(8, 1, 8), (8, 2, 4), (8, 8, 1), (8, 16, 1), (8, 64, 1), (1, 8, 1), (32, 4, 8)],
)
def test_kv_heads_per_rank_replicates_when_tp_exceeds_kv_heads(kv_heads: int, tp: int, per_rank: int) -> None:
    assert kv_heads_per_rank(kv_heads, tp) == per_rank


def test_llama_3_70b_tp16_keeps_one_replicated_kv_head_per_rank() -> None:
    # llama-3-70b.json: 8 KV heads, head_dim 8192/64 = 128, 80 layers. tp 16 > 8: one head per rank.
    assert per_token("llama-3-70b", tp=16) == 2 * 1 * 128 * 2 * 80
    assert per_token("llama-3-70b", tp=8) == per_token("llama-3-70b", tp=16)
    assert per_token("llama-3-70b", tp=4) == 2 * 2 * 128 * 2 * 80


def test_report_per_token_is_per_rank_under_tp() -> None:
    tp2 = serving("llama-3.1-8b", engine="vllm", parallel={"tp": 2, "gpus": 2})
    assert tp2.kv_bytes_per_token == 131_072 // 2


# ---- paging, fp8 --------------------------------------------------------------------------------


@pytest.mark.parametrize(("tokens", "slots"), [(0, 0), (1, 16), (15, 16), (16, 16), (17, 32), (1000, 1008)])
def test_paged_tokens_rounds_up_to_whole_blocks(tokens: int, slots: int) -> None:
    assert paged_tokens(tokens, 16) == slots
    assert paged_tokens(tokens, None) == tokens


def test_vllm_kv_needed_is_paged() -> None:
    # 3 sequences x ceil(1000 / 16) = 63 blocks of 16 tokens x 131072 B (Llama-3.1-8B, bf16).
    expected = 3 * math.ceil(1000 / 16) * 16 * 131_072
    got = serving("llama-3.1-8b", engine="vllm", batch=3, context=1000, block_size=16)
    assert got.kv_bytes_needed == expected
    assert got.kv_block_bytes == 16 * 131_072


def test_hf_kv_needed_is_not_paged() -> None:
    got = serving("llama-3.1-8b", batch=3, context=1000)
    assert got.kv_bytes_needed == 3 * 1000 * 131_072


def test_fp8_kv_halves_the_cache_in_vllm() -> None:
    auto = serving("llama-3.1-8b", engine="vllm", batch=2, prompt=1000, generate=24)
    fp8 = serving("llama-3.1-8b", engine="vllm", batch=2, prompt=1000, generate=24, kv_dtype="fp8")
    assert fp8.kv_bytes_per_token * 2 == auto.kv_bytes_per_token == 131_072
    assert fp8.kv_bytes_needed * 2 == auto.kv_bytes_needed


def test_explicit_bf16_kv_equals_auto_under_bf16_compute() -> None:
    assert serving("llama-3.1-8b", kv_dtype="bf16") == serving("llama-3.1-8b")
