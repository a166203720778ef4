"""gpt-oss's MXFP4 experts in memory, worked out by hand from the config and checked against the
model card's checkpoint sizes (gpt-oss model card, arXiv:2508.10925, Table 1: 12.8 GiB for
gpt-oss-20b, 60.8 GiB for gpt-oss-120b)."""

from __future__ import annotations

from typing import Any

import pytest

from vramlens.estimator import estimate
from vramlens.model.resolve import load_model, model_from_config
from vramlens.units import GiB

BF16, FP32 = 2, 4


def weights(model: Any, **workload: Any) -> int:
    report = estimate({"model": model, "mode": "infer", "prompt": 16, "generate": 1, **workload})
    return next(term.bytes for term in report.terms if term.name == "weights")


def gpt_oss_bytes(*, layers: int, experts: int) -> float:
    """gpt-oss-20b/120b: hidden 2880, expert width 2880, 64 query heads and 8 KV heads of 64,
    vocab 201088, untied. MXFP4 experts: gate_up [2880 -> 5760] and down [2880 -> 2880] as packed
    4-bit pairs (n/2 bytes) plus one E8M0 scale per 32 elements (n/32), biases kept in float32 by
    transformers' Mxfp4GptOssExperts; attention (biased, plus 64 sinks), router (biased), norms,
    embedding and head in bf16 (modules_to_not_convert)."""
    h, i, vocab = 2880, 2880, 201088
    q, kv = 64 * 64, 8 * 64
    expert_elements = h * 2 * i + i * h
    experts_bytes = experts * (expert_elements / 2 + expert_elements / 32 + FP32 * (2 * i + h))
    attention = h * q + q + 2 * (h * kv + kv) + q * h + h + 64
    router = h * experts + experts
    norms = 2 * h
    per_layer = experts_bytes + BF16 * (attention + router + norms)
    return layers * per_layer + BF16 * (2 * vocab * h + h)


@pytest.mark.parametrize(
    ("name", "layers", "experts", "card_gib"),
    [("gpt-oss-20b", 24, 32, 12.8), ("gpt-oss-120b", 36, 128, 60.8)],
)
def test_gpt_oss_weights_by_hand_and_against_the_model_card(
    name: str, layers: int, experts: int, card_gib: float
) -> None:
    expected = gpt_oss_bytes(layers=layers, experts=experts)
    assert weights(name) == pytest.approx(expected, abs=1)
    # The card's checkpoint stores the biases in bf16: within 0.5% of what sits in GPU memory.
    assert weights(name) / GiB == pytest.approx(card_gib, rel=0.005)


def test_mxfp4_quantizes_only_the_experts_whatever_modules_to_not_convert_says() -> None:
    """transformers' replace_with_mxfp4_linear converts gpt-oss's expert modules and nothing else:
    a config without modules_to_not_convert still keeps attention in bf16."""
    config = dict(load_model("gpt-oss-20b").config or {})
    bare = {**config, "quantization_config": {"quant_method": "mxfp4"}}
    assert weights(model_from_config(bare)) == weights("gpt-oss-20b")


def test_dequantize_true_means_bf16_experts() -> None:
    config = dict(load_model("gpt-oss-20b").config or {})
    spec = model_from_config({**config, "quantization_config": {"quant_method": "mxfp4", "dequantize": True}})
    assert spec.quantization is None
    assert any("dequantize: true" in note for note in spec.assumptions)
    assert weights(spec) == pytest.approx(BF16 * spec.num_parameters, rel=1e-9)
