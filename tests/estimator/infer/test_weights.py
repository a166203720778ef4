"""Inference weights: published figures (seed 003, vLLM logs), quantized storage worked out by hand,
checkpoint quantization_config, tensor parallelism and tied embeddings."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from conftest import REPO_ROOT
from vramlens.estimator import estimate
from vramlens.estimator.infer.context import resolve_inference
from vramlens.estimator.infer.weights import StageWeights, stage_weights
from vramlens.estimator.weight_format import format_for_checkpoint, format_for_quant
from vramlens.model.resolve import load_model, model_from_config
from vramlens.model.spec import ModelSpec
from vramlens.units import GiB
from vramlens.workload.load import load_workload
from vramlens.workload.options import Quant

CATALOG = REPO_ROOT / "src" / "vramlens" / "model" / "catalog"
BF16 = 2
# llama-3.1-8b.json: hidden_size 4096, num_key_value_heads 8 x 128 = 1024, intermediate_size 14336,
# vocab_size 128256, num_hidden_layers 32, untied; RMSNorm weights only (no biases).
H, KV, FF, VOCAB, LAYERS = 4096, 1024, 14336, 128256, 32


def weights(model: str | ModelSpec, **workload: Any) -> int:
    report = estimate({"model": model, "mode": "infer", **workload})
    return next(term.bytes for term in report.terms if term.name == "weights")


def stages(model: str, **workload: Any) -> tuple[StageWeights, ...]:
    spec = load_model(model)
    return stage_weights(resolve_inference(spec, load_workload({"model": model, "mode": "infer", **workload}), None))


def catalog_config(name: str) -> dict[str, Any]:
    return dict(json.loads((CATALOG / f"{name}.json").read_text())["config"])


# ---- published figures -------------------------------------------------------------------------


def test_llama_3_70b_bf16_weights_seed_003() -> None:
    # shared/seeds/003_*.txt: "Total Memory = 70,000,000,000 parameters x 2 bytes/parameter =
    # 140,000,000,000 bytes" ... "÷ 1,073,741,824 bytes/GB ≈ 130.4 GB" (binary GB).
    spec = load_model("llama-3-70b")
    got = weights("llama-3-70b", precision="bf16", engine="hf")
    assert got == spec.num_parameters * 2  # 70.55e9 parameters, all bf16, tp 1
    assert got / GiB == pytest.approx(130.4, rel=0.01)  # 131.4 GiB: +0.79% for the exact count


def test_phi_3_mini_vllm_weights_seed_003() -> None:
    # Seed 003 (H100 + vLLM + Phi3 Mini 4K): "Loading model weights occupied 7.1183 GB" (GiB).
    # phi-3-mini.json: vocab_size 32064 = 501 x 64, so vLLM's padding to 64 adds no rows.
    assert 32064 % 64 == 0
    got = weights("phi-3-mini", engine="vllm")
    assert got == load_model("phi-3-mini").num_parameters * 2
    assert got / GiB == pytest.approx(7.1183, rel=0.01)


@pytest.mark.parametrize(("tp", "logged_gib"), [(1, 14.96), (2, 7.48)])
def test_llama_3_8b_vllm_weights_match_the_vllm_log(tp: int, logged_gib: float) -> None:
    # vllm-project/vllm PR #10511 (2024-12-14), `vllm serve meta-llama/Meta-Llama-3-8B`:
    # "model weights take 14.96GiB" at tp 1 and "7.48GiB" at -tp 2.
    got = weights("llama-3-8b", engine="vllm", parallel={"tp": tp, "gpus": tp})
    assert got / GiB == pytest.approx(logged_gib, rel=0.005)


# ---- quantized linears, by hand ----------------------------------------------------------------


def test_gptq_int4_linear_bytes_by_hand() -> None:
    # down_proj of Llama-3.1-8B: out 4096, in 14336; GPTQ int4, group 128 -> 112 groups.
    out, inp, groups = H, FF, FF // 128
    qweight = out * inp // 2  # 4 bits per element, packed
    scales = groups * out * 2  # fp16 per (group, output)
    qzeros = groups * (out * 4 // 32) * 4  # 4-bit zeros packed in int32 words
    g_idx = inp * 4  # int32 per input feature
    fmt = format_for_quant(Quant.GPTQ_INT4)
    assert fmt is not None
    assert fmt.linear_bytes(out, inp) == qweight + scales + qzeros + g_idx == 30_564_352


def test_awq_int4_linear_has_no_g_idx() -> None:
    gptq, awq = format_for_quant(Quant.GPTQ_INT4), format_for_quant(Quant.AWQ_INT4)
    assert gptq is not None and awq is not None
    assert gptq.linear_bytes(H, H) - awq.linear_bytes(H, H) == H * 4


def test_nf4_with_and_without_double_quant() -> None:
    n = H * H
    nf4, nf4_dq = format_for_quant(Quant.NF4), format_for_quant(Quant.NF4_DQ)
    assert nf4 is not None and nf4_dq is not None
    # one fp32 absmax per 64 elements: 0.5 + 4/64 bytes per element, and the layer's 16-entry
    # fp32 NF4 code book (64 B)
    assert nf4.linear_bytes(H, H) == n * (0.5 + 4 / 64) + 64
    # absmax as int8 per 64, plus one fp32 scale per 256 absmaxes: 0.5 + 1/64 + 4/(64*256); the
    # code book, the nested state's 256-entry fp32 map and its 0-dim fp32 offset (1,092 B)
    assert nf4_dq.linear_bytes(H, H) == n * (0.5 + 1 / 64 + 4 / (64 * 256)) + 64 + 1024 + 4


def test_int8_and_fp8_linears() -> None:
    int8, fp8 = format_for_quant(Quant.INT8), format_for_quant(Quant.FP8)
    assert int8 is not None and fp8 is not None
    assert int8.linear_bytes(FF, H) == FF * H + FF * 4  # one fp32 SCB per output row
    assert fp8.linear_bytes(FF, H) == FF * H + (FF // 128) * (H // 128) * 4  # fp32 per 128x128 tile


def _llama_8b_weights(linear: Any) -> float:
    """Llama-3.1-8B with ``linear(out, in)`` bytes per linear; everything else bf16."""
    attn = 2 * linear(H, H) + 2 * linear(KV, H)  # q, o; k, v
    mlp = 2 * linear(FF, H) + linear(H, FF)  # gate, up; down
    norms = 2 * H * BF16
    return 2 * VOCAB * H * BF16 + H * BF16 + LAYERS * (attn + mlp + norms)  # embed + head + final norm


def test_awq_int4_keeps_embedding_and_head_bf16() -> None:
    def awq(out: int, inp: int) -> float:
        groups = inp // 128
        return out * inp / 2 + groups * out * 2 + groups * (out * 4 // 32) * 4

    got = weights("llama-3.1-8b", quant="awq-int4")
    assert got == _llama_8b_weights(awq) == 5_727_854_592
    assert got > 2 * VOCAB * H * BF16  # the two bf16 vocabulary tables alone are 2.1 GB


def test_nf4_llama_weights_by_hand() -> None:
    def nf4(out: int, inp: int) -> float:
        return out * inp * (0.5 + 4 / 64) + 64  # + the layer's fp32 NF4 code book

    assert weights("llama-3.1-8b", quant="nf4") == _llama_8b_weights(nf4)


# ---- the checkpoint's quantization_config ------------------------------------------------------


def _gptq_llama(**config: Any) -> ModelSpec:
    quantization = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, **config}
    return model_from_config({**catalog_config("llama-3.1-8b"), "quantization_config": quantization}, name="gptq")


def _gptq(group: int) -> Any:
    def linear(out: int, inp: int) -> float:
        groups = inp // group
        return out * inp / 2 + groups * out * 2 + groups * (out * 4 // 32) * 4 + inp * 4

    return linear


def test_checkpoint_gptq_group_64_is_used() -> None:
    spec = _gptq_llama(group_size=64)
    assert spec.quantization is not None
    fmt = format_for_checkpoint(spec.quantization)
    assert (fmt.group_size, fmt.bits, fmt.g_idx, fmt.source) == (64, 4, True, "checkpoint")
    group_64, group_128 = weights(spec), weights(_gptq_llama())
    assert group_64 == _llama_8b_weights(_gptq(64))
    assert group_128 == _llama_8b_weights(_gptq(128))
    assert group_64 > group_128


def test_checkpoint_quant_is_noted() -> None:
    report = estimate({"model": _gptq_llama(), "mode": "infer"})
    assert any("gptq-int4" in note and "quantization_config" in note for note in report.assumptions)


def test_modules_to_not_convert_stay_in_bf16() -> None:
    skipped = weights(_gptq_llama(modules_to_not_convert=["down_proj"]))
    quantized = weights(_gptq_llama())
    assert skipped - quantized == LAYERS * (H * FF * BF16 - _gptq(128)(H, FF))


def test_a_skip_entry_naming_one_layer_skips_only_that_layer() -> None:
    skipped = weights(_gptq_llama(modules_to_not_convert=["model.layers.0.mlp.down_proj"]))
    quantized = weights(_gptq_llama())
    assert skipped - quantized == H * FF * BF16 - _gptq(128)(H, FF)


# ---- tensor and pipeline parallelism, tied tables ----------------------------------------------


def test_tp2_halves_all_but_the_replicated_norms() -> None:
    tp1 = weights("llama-3.1-8b")
    tp2 = weights("llama-3.1-8b", parallel={"tp": 2, "gpus": 2})
    norms = (2 * LAYERS + 1) * H * BF16  # input + post-attention norm per layer, final norm
    assert 2 * tp2 - tp1 == norms
    assert tp1 / 2 < tp2 < tp1 / 2 * 1.001


def test_tied_embedding_is_counted_once_at_pp1() -> None:
    # qwen2.5-0.5b.json: tie_word_embeddings true, vocab_size 151936, hidden_size 896.
    spec = load_model("qwen2.5-0.5b")
    assert spec.tie_word_embeddings
    assert weights("qwen2.5-0.5b") == spec.num_parameters * 2
    (stage,) = stages("qwen2.5-0.5b")
    assert stage.embedding_bytes == 151936 * 896 * BF16
    assert stage.head_bytes == 896 * BF16  # the final norm only: the head is the embedding


def test_tied_embedding_on_two_stages_is_held_by_both() -> None:
    first, last = stages("qwen2.5-0.5b", parallel={"pp": 2, "gpus": 2})
    table = 151936 * 896 * BF16
    assert (first.first, first.last, last.first, last.last) == (True, False, False, True)
    assert first.embedding_bytes == table and first.head_bytes == 0
    assert last.embedding_bytes == 0 and last.head_bytes == table + 896 * BF16
    assert first.layer_bytes == last.layer_bytes  # 24 layers, 12 per stage


def test_vllm_pads_an_unaligned_vocabulary_to_64() -> None:
    # gpt2.json: vocab_size 50257 -> 50304 rows in vLLM (786 x 64); tied head, n_embd 768.
    short = {"prompt": 512, "generate": 64}
    padded = weights("gpt2", engine="vllm", **short) - weights("gpt2", engine="hf", **short)
    assert padded == (50304 - 50257) * 768 * BF16


def test_vllm_vocab_slice_per_rank_is_the_padded_vocab_over_tp() -> None:
    # mistral-7b.json: vocab_size 32000 (= 500 x 64), hidden_size 4096, untied.
    (stage,) = stages("mistral-7b", engine="vllm", parallel={"tp": 8, "gpus": 8})
    assert stage.embedding_bytes == math.ceil(32000 / 64) * 64 // 8 * 4096 * BF16


def test_tp_beyond_kv_heads_keeps_one_whole_kv_head_per_rank() -> None:
    # llama-3-70b.json: hidden 8192, 64 heads, 8 KV heads of 128, intermediate 28672, 80 layers.
    h, ff, hd, tp = 8192, 28672, 128, 16
    per_layer = (2 * h * h // tp + 2 * 1 * hd * h + 3 * h * ff // tp) * BF16 + 2 * h * BF16
    (stage,) = stages("llama-3-70b", engine="vllm", parallel={"tp": tp, "gpus": tp})
    assert stage.layer_bytes == 80 * per_layer
