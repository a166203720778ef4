"""QLoRA on a bitsandbytes 4-bit base (``estimate/qlora.py``): each term by hand.

The tiny Llama (h 128, i 344, 2 layers, 4 heads of 32, 2 KV heads, vocabulary 1000,
untied) has per layer the linears q 128x128, k 64x128, v 64x128, o 128x128, gate and
up 344x128, down 128x344. Agreement with the simulator of the same recipe is in
``tests/simulator/test_quant.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from vramlens import model_from_config
from vramlens.dtypes import nf4_state_bytes
from vramlens.estimator import estimate
from vramlens.estimator.layout import param_layout
from vramlens.estimator.qlora import (
    adapter_inputs_shared,
    base_output_bytes,
    dequantized_bytes,
    head_weight_cast_bytes,
    unquantized_bytes,
)
from vramlens.estimator.recompute import layer_activations, train_state
from vramlens.estimator.weight_format import format_for_quant
from vramlens.resolve import frameworks as frameworks_module
from vramlens.resolve.context import resolve_training
from vramlens.resolve.kbit import bnb_4bit_base, kbit_prepared
from vramlens.workload.load import load_workload
from vramlens.workload.options import Framework, Quant

_TINY = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}
_LINEARS = [(128, 128), (64, 128), (64, 128), (128, 128), (344, 128), (344, 128), (128, 344)]
H, INNER, V, LAYERS, RANK = 128, 344, 1000, 2, 16


def _context(**fields: Any) -> Any:
    workload = load_workload({"model": "tiny", "method": "qlora", "framework": "hf", "seq": 64, **fields}, {})
    return resolve_training(model_from_config(dict(_TINY)), workload)


def _without_preparation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hf profile without k-bit preparation (TRL >= 0.27); each test builds a new spec, so no memo is stale."""
    profile = dataclasses.replace(frameworks_module.FRAMEWORKS[Framework.HF], kbit_prepare=False)
    monkeypatch.setitem(frameworks_module.FRAMEWORKS, Framework.HF, profile)


def test_which_workloads_have_a_4bit_base_and_run_the_preparation() -> None:
    assert kbit_prepared(_context().workload, _context().profile)
    assert bnb_4bit_base(_context(method="lora", quant="nf4").workload)
    assert not bnb_4bit_base(_context(method="lora").workload)
    assert not bnb_4bit_base(_context(quant="gptq-int4").workload)
    # TRL skips the preparation for sharded QLoRA (FSDP / ZeRO-3); frameworks without PEFT never run it.
    for fields in ({"parallel": {"gpus": 2, "shard": "fsdp"}}, {"parallel": {"gpus": 2, "shard": "zero3"}}):
        ctx = _context(**fields)
        assert not kbit_prepared(ctx.workload, ctx.profile)
    ctx = _context(framework="torchtune")
    assert not kbit_prepared(ctx.workload, ctx.profile)
    assert kbit_prepared(_context(parallel={"gpus": 2, "shard": "ddp"}).workload, _context().profile)


def test_unquantized_weights_are_fp32_after_preparation() -> None:
    assert unquantized_bytes(_context()) == 4
    assert unquantized_bytes(_context(parallel={"gpus": 2, "shard": "fsdp"})) == 2  # bf16 frozen weights


def test_nf4_weight_bytes_with_their_quant_state_by_hand() -> None:
    nf4_dq = format_for_quant(Quant.NF4_DQ)
    assert nf4_dq is not None
    n = 4096 * 4096
    # 8 MiB packed pairs, one uint8 absmax per 64 (262,144 B), one fp32 scale per 256 absmax
    # (1,024 x 4 B), the 0-dim offset, the 256-entry nested map and the 16-entry NF4 code book.
    assert nf4_dq.linear_bytes(4096, 4096) == n / 2 + n // 64 + 1024 * 4 + 4 + 1024 + 64
    assert nf4_state_bytes(double_quant=True) == 4 + 1024 + 64
    nf4 = format_for_quant(Quant.NF4)
    assert nf4 is not None
    assert nf4.linear_bytes(4096, 4096) == n / 2 + n // 64 * 4 + 64


def _hand_parameters(*, rest_bytes: int) -> int:
    def nf4_dq(out_features: int, in_features: int) -> int:
        n = out_features * in_features
        blocks = -(-n // 64)
        return n // 2 + blocks + 4 * -(-blocks // 256) + 4 + 1024 + 64

    quantized = LAYERS * sum(nf4_dq(o, i) for o, i in _LINEARS)
    adapters = LAYERS * sum(RANK * (o + i) * 4 for o, i in _LINEARS)  # PEFT's fp32 adapters
    rest = 2 * V * H + (2 * LAYERS + 1) * H  # embedding, LM head, norms
    return quantized + adapters + rest * rest_bytes


def test_parameters_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    workload = {"model": model_from_config(dict(_TINY)), "method": "qlora", "framework": "hf", "seq": 64}
    terms = {term.name: term.bytes for term in estimate(workload).terms}
    assert terms["parameters"] == _hand_parameters(rest_bytes=4)
    _without_preparation(monkeypatch)
    terms = {term.name: term.bytes for term in estimate({**workload, "model": model_from_config(dict(_TINY))}).terms}
    assert terms["parameters"] == _hand_parameters(rest_bytes=2)


def test_moe_experts_stay_unquantized() -> None:
    """transformers 5's fused 3-D experts are not nn.Linear, so bitsandbytes leaves them alone:
    8 experts x 3 x 256 x 128 elements per layer at the rest dtype; routers likewise."""
    config = {
        "model_type": "qwen3_moe", "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 128,
        "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000, "max_position_embeddings": 4096,
        "decoder_sparse_step": 1, "mlp_only_layers": [],
    }  # fmt: skip
    workload = load_workload({"model": "tiny", "method": "qlora", "framework": "hf", "seq": 64}, {})
    ctx = resolve_training(model_from_config(config), workload)
    frozen = param_layout(ctx).stages[0].frozen_bytes
    nf4_dq = format_for_quant(Quant.NF4_DQ)
    assert nf4_dq is not None
    attention = [(128, 128), (64, 128), (64, 128), (128, 128)]
    quantized = 2 * sum(nf4_dq.linear_bytes(o, i) for o, i in attention)
    experts, router, norms = 8 * 3 * 128 * 128, 8 * 128, 2 * 128 + 2 * 32
    rest = 2 * (experts + router + norms) + 2 * 1000 * 128 + 128
    assert frozen == pytest.approx(quantized + 4 * rest)


def test_activation_dtypes_after_preparation() -> None:
    ctx = _context()
    assert base_output_bytes(ctx) == 4  # Linear4bit returns its (fp32) input's dtype
    assert adapter_inputs_shared(ctx)
    assert dequantized_bytes(ctx) == 2
    assert not adapter_inputs_shared(_context(lora={"dropout": 0.1}))  # a dropped copy per adapter
    assert not adapter_inputs_shared(_context(framework="torchtune"))  # its own LoRA layers, not PEFT's
    # Without autocast the model computes in its fp32 weights outside the 4-bit matmuls.
    pure = _context(precision="bf16")
    assert pure.compute_bytes == 4 and base_output_bytes(pure) == 0 and adapter_inputs_shared(pure)


def _saved_per_token(ctx: Any) -> float:
    targets = param_layout(ctx).targets
    return layer_activations(ctx, train_state(ctx, targets), range(1)).saved_per_token


def test_one_layer_saved_bytes_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes per token one Llama layer keeps (SDPA, no recompute, rank 16 on all linears):

    * prepared: two norms keep their fp32 input (the residual itself) and an rsqrt; the five
      adapters on q/k/v/gate/up keep their own bf16 autocast cast of the fp32 norm output; the
      attention kernel keeps q, k, v, the output (o_proj's adapter reads it as is) and a
      log-sum-exp per head; the MLP keeps gate, act and up in fp32 (the 4-bit linears return
      fp32) and down's adapter a bf16 cast of the fp32 product; each lora_A output is bf16;
    * not prepared: the bf16 norm outputs and product are kept once, whatever the adapters.
    """
    q, kv, heads, lora = 128, 64, 4, 7 * 2 * RANK
    norms = 2 * (4 * H + 4)
    attention = 2 * q + 2 * 2 * kv + 2 * q + 4 * heads
    prepared = norms + 5 * 2 * H + attention + 3 * 4 * INNER + 2 * INNER + lora
    assert _saved_per_token(_context()) == prepared
    _without_preparation(monkeypatch)
    shared = norms + 2 * (2 * H) + attention + 3 * 2 * INNER + 2 * INNER + lora
    assert _saved_per_token(_context()) == shared


def test_lm_head_weight_copy_by_hand() -> None:
    ctx = _context()
    assert head_weight_cast_bytes(ctx, V) == V * H * 2
    assert head_weight_cast_bytes(_context(precision="bf16"), V) == 0  # no autocast: no copy
    terms = {t.name: t.bytes for t in estimate({**_workload(), "model": model_from_config(dict(_TINY))}).terms}
    assert terms["LM head bf16 weight copy (fp32 head after k-bit preparation)"] == V * H * 2


def _workload() -> dict[str, Any]:
    return {"method": "qlora", "framework": "hf", "seq": 64}


def test_the_dequantized_weight_is_not_counted_at_the_loss() -> None:
    report = estimate({**_workload(), "model": model_from_config(dict(_TINY)), "batch": 4, "seq": 512})
    forward = next(phase for phase in report.phases if phase.name == "forward")
    terms = {t.name: t.bytes for t in report.terms}
    logits = (
        terms["logits and loss (at the loss)"] + terms["LM head bf16 weight copy (fp32 head after k-bit preparation)"]
    )
    # The loss is the forward's high point here; no 4-bit linear runs then.
    assert forward.breakdown["temporary"] == logits


def test_the_assumption_is_reported() -> None:
    report = estimate({**_workload(), "model": model_from_config(dict(_TINY))})
    assert any(note.startswith("qlora: peft.prepare_model_for_kbit_training assumed") for note in report.assumptions)
    sharded = estimate(
        {**_workload(), "model": model_from_config(dict(_TINY)), "parallel": {"gpus": 2, "shard": "fsdp"}}
    )
    assert any(note.startswith("qlora: no k-bit preparation") for note in sharded.assumptions)
