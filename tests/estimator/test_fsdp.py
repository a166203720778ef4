"""FSDP's unsharded parameters, buffers and gradients (``estimate/fsdp.py``) by hand.

llama-3.1-8b: hidden h = 4096, vocabulary V = 128,256, 32 layers of
L = 2 x 4096^2 (q, o) + 2 x 1024 x 4096 (k, v) + 3 x 14,336 x 4096 (MLP) + 2 x 4096 (norms)
= 218,112,000 elements; embedding E = V x h = 525,336,576; tail T = E + h = 525,340,672
(final norm + untied head). Under ``split`` (FSDP2 as accelerate wraps it) with bf16
compute (a = 2) and reduce (r = 2):

* a layer's forward: its parameters and its all-gather output, 2aL;
* the loss (inside the model's forward under HF): the tail and its all-gather output, 2aT;
* backward start: aT;
* a layer's backward: 2aL + aL gradients + the previous unit's reduce-scatter input, the
  head's rT for the first layer reached;
* the first layer's backward: aL + aE (the embedding prefetched) + aL gradients + rL;
* the embedding's backward: 2aE + rL.
"""

from __future__ import annotations

from typing import Any

import pytest

from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.estimator import estimate
from vramlens.estimator.fsdp import (
    Units,
    casts_outputs,
    fsdp2_root_kept,
    fsdp2_root_unsharded,
    resolved_wrap,
    root_unsharded,
    split_unsharded,
    units,
    uses_fsdp2,
)
from vramlens.estimator.layout import StageView, param_layout
from vramlens.model.resolve import load_model
from vramlens.resolve.context import TrainingContext, resolve_training
from vramlens.workload.load import load_workload
from vramlens.workload.options import FsdpWrap

L, E, H, V = 218_112_000, 525_336_576, 4096, 128_256
T = E + H
N = 8_030_261_248
TOKENS = 2048


def _workload(**fields: Any) -> dict[str, Any]:
    parallel = {"gpus": 8, "shard": "fsdp"} | fields.pop("parallel", {})
    return {"model": "llama-3.1-8b", "framework": "hf", "batch": 1, "seq": TOKENS, "parallel": parallel, **fields}


def _context(**fields: Any) -> tuple[TrainingContext, StageView]:
    workload = load_workload(_workload(**fields))
    ctx = resolve_training(load_model("llama-3.1-8b"), workload)
    return ctx, param_layout(ctx).stages[0]


def test_model_shapes() -> None:
    assert L == 2 * 4096**2 + 2 * 1024 * 4096 + 3 * 14_336 * 4096 + 2 * 4096
    assert E == V * H and load_model("llama-3.1-8b").num_parameters == 32 * L + 2 * E + H == N


def test_units_of_full_bf16_training_under_accelerate() -> None:
    ctx, stage = _context(precision="bf16")
    assert units(ctx, stage) == Units(
        layer=2 * L,
        layer_grads=2 * L,
        layer_reduce=2 * L,
        embedding=2 * E,
        embedding_grads=2 * E,
        embedding_reduce=2 * E,
        tail=2 * T,
        tail_grads=2 * T,
        tail_reduce=2 * T,
        tied=False,
    )


def test_torchtitan_reduces_in_fp32_and_lora_reduces_only_adapters() -> None:
    ctx, stage = _context(precision="mixed-bf16", framework="torchtitan")
    u = units(ctx, stage)
    # bf16 all-gathers (param_dtype), fp32 reduce-scatter inputs (mixed_precision_reduce).
    assert (u.layer, u.layer_grads, u.layer_reduce, u.tail_reduce) == (2 * L, 2 * L, 4 * L, 4 * T)
    ctx, stage = _context(precision="bf16", method="lora", lora={"rank": 16, "targets": "all-linear"})
    u = units(ctx, stage)
    # rank 16 on q, k, v, o, gate, up, down: 16 x (in + out) each.
    adapters = 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 2 * (4096 + 14_336) + (14_336 + 4096))
    assert adapters == 1_310_720
    assert (u.layer, u.layer_grads, u.layer_reduce) == (2 * (L + adapters), 2 * adapters, 2 * adapters)
    assert (u.embedding_grads, u.tail_grads, u.tail_reduce) == (0, 0, 0)  # frozen embedding and head


def test_split_instants_by_hand() -> None:
    ctx, stage = _context(precision="bf16")
    found = split_unsharded(units(ctx, stage), loss_in_model=True)
    assert found.forward_layer == 2 * 2 * L == 872_448_000
    assert found.loss == 2 * 2 * T == 2_101_362_688
    assert found.backward_start == 2 * T == 1_050_681_344
    assert found.first_layers == 3 * 2 * L + 2 * T == 2_359_353_344
    assert found.last_layer == 2 * L + 2 * E + 2 * L + 2 * L == 2_359_345_152
    assert found.end == 2 * 2 * E + 2 * L == 2_537_570_304
    # torchtitan computes the loss after the root's post-forward has freed the tail's all-gather output.
    assert split_unsharded(units(ctx, stage), loss_in_model=False).loss == 2 * T


def test_split_instants_of_a_tied_tail() -> None:
    # Tied: the embedding is in the tail, gathered from the embedding's forward to the end of
    # backward, with the head's gradient beside it; at the loss the last layer's all-gather
    # output is still alive; the embedding's backward adds its contribution and their sum.
    u = Units(
        layer=10,
        layer_grads=10,
        layer_reduce=10,
        embedding=0,
        embedding_grads=0,
        embedding_reduce=0,
        tail=100,
        tail_grads=100,
        tail_reduce=100,
        tied=True,
    )
    found = split_unsharded(u, loss_in_model=True)
    assert (found.forward_layer, found.loss, found.backward_start) == (2 * 10 + 100, 100 + 10, 100)
    assert found.first_layers == found.last_layer == 100 + 100 + 2 * 10 + 10 + 10
    assert found.end == 100 + 3 * 100 + 10


def test_root_wrapping_keeps_the_old_formula() -> None:
    # FSDP1 (and torchtitan before 2025-07-28): embedding and head in the root, two layers in flight,
    # and in backward one layer's gradients and reduce-scatter input.
    ctx, stage = _context(precision="bf16", fsdp_wrap="root")
    found = root_unsharded(ctx, stage)
    assert found.loss == found.forward_layer == (2 * L + 2 * E) * 2 == 2_973_794_304
    assert found.backward_start == found.end == 2_973_794_304 + L * (2 + 2)


def test_litgpt_lora_runs_fsdp2_with_the_root_kept_gathered() -> None:
    # litgpt finetune/lora.py: fully_shard per Block and on the model (reshard_after_forward left to
    # its default: the root unit, embedding + final norm + head, stays gathered until the end of
    # backward); each Block reshards after its forward. LoRA rank 8 on q and v: adapters
    # A = 8 x (2 x 4096 + 4096 + 1024) per layer; the frozen embedding and head have no gradients.
    lora = {"method": "lora", "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]}}
    ctx, stage = _context(precision="bf16", framework="litgpt", **lora)
    assert fsdp2_root_kept(ctx) and uses_fsdp2(ctx)
    a = 8 * (2 * 4096 + 4096 + 1024)
    layer, adapters, root = 2 * (L + a), 2 * a, 2 * (E + T)
    found = fsdp2_root_unsharded(units(ctx, stage), loss_in_model=False)
    assert (found.forward_layer, found.loss, found.backward_start) == (root + 2 * layer, root, root)
    assert found.first_layers == root + 2 * layer + 2 * adapters  # + the layer's gradients and reduce-scatter input
    assert found.last_layer == root + layer + 2 * adapters  # nothing to prefetch: the root is gathered
    assert found.end == root + adapters
    # Its full fine-tune (finetune/full.py) is Lightning's FSDPStrategy, FSDP1: the root rule; torchtune's
    # shard_model passes reshard_after_forward to the root too, which FSDP2 then honours.
    assert not fsdp2_root_kept(_context(precision="bf16", framework="litgpt")[0])
    assert not fsdp2_root_kept(_context(precision="bf16", framework="torchtune", **lora)[0])


def test_fsdp2_root_instants_in_full_training() -> None:
    # The head's gradient is made first in backward and stays unsharded until the root's post-backward;
    # at the end the root's gradients beside their reduce-scatter input.
    u = Units(
        layer=10,
        layer_grads=10,
        layer_reduce=10,
        embedding=100,
        embedding_grads=100,
        embedding_reduce=100,
        tail=101,
        tail_grads=101,
        tail_reduce=101,
        tied=False,
    )
    found = fsdp2_root_unsharded(u, loss_in_model=True)
    assert (found.forward_layer, found.loss, found.backward_start) == (201 + 20, 201 + 10, 201 + 101)
    assert (found.first_layers, found.last_layer) == (302 + 10 + 30, 302 + 30)
    assert found.end == 302 + 100 + 201


def test_which_wrapping_applies() -> None:
    assert resolved_wrap(_context()[0]) is FsdpWrap.SPLIT  # hf: accelerate's FSDP2
    assert resolved_wrap(_context(framework="torchtitan")[0]) is FsdpWrap.SPLIT
    assert resolved_wrap(_context(framework="litgpt")[0]) is FsdpWrap.ROOT
    assert resolved_wrap(_context(fsdp_wrap="root")[0]) is FsdpWrap.ROOT
    assert resolved_wrap(_context(parallel={"shard": "zero3"})[0]) is FsdpWrap.ROOT  # DeepSpeed's rules
    with pytest.raises(InputError, match=r"^fsdp_wrap: 'split' applies to parallel.shard fsdp or hsdp"):
        _context(parallel={"shard": "zero3"}, fsdp_wrap="split")


def test_fsdp2_casts_kept_logits_back_to_half_under_accelerate() -> None:
    assert casts_outputs(_context(precision="mixed-bf16")[0])
    assert not casts_outputs(_context(precision="bf16")[0])
    assert not casts_outputs(_context(precision="mixed-bf16", fsdp_wrap="root")[0])
    assert not casts_outputs(_context(precision="mixed-bf16", framework="torchtitan")[0])


def _temporary(report: Any, phase: str) -> int:
    return next(p for p in report.phases if p.name == phase).breakdown[Category.TEMPORARY]


def test_phases_of_full_bf16_training_with_recompute() -> None:
    # At the loss: bf16 logits, their fp32 copy and log-softmax, (2 + 4 + 4)V per token, beside
    # the tail and its all-gather output. Backward start: 12V + the kept bf16 logits 2V, beside
    # the tail alone.
    report = estimate(_workload(precision="bf16", recompute="full"))
    forward = TOKENS * 10 * V + 2 * 2 * T
    backward = TOKENS * 14 * V + 2 * T
    assert _temporary(report, "forward") == forward == 4_728_045_568
    assert _temporary(report, "backward") == backward == 4_728_037_376
    assert report.peak_phase == "forward"


def test_mixed_precision_keeps_bf16_logits_under_fsdp2() -> None:
    # output_dtype=bf16 casts accelerate's fp32 logits back: backward start (12 + 2)V, not (12 + 4)V.
    report = estimate(_workload(precision="mixed-bf16"))
    start = next(p for p in report.phases if p.name == "backward")
    assert start.note.startswith("start of backward")
    assert start.breakdown[Category.TEMPORARY] == TOKENS * 14 * V + 2 * T


def test_gradient_accumulation_without_sync_keeps_every_unsharded_gradient() -> None:
    # Trainer's no_sync: the first micro-step reduce-scatters nothing, so during the last one's
    # forward every bf16 gradient is alive unsharded (2N) and no sharded gradient exists yet.
    report = estimate(_workload(precision="bf16", recompute="full", grad_accum=2))
    forward = next(p for p in report.phases if p.name == "forward")
    assert forward.breakdown[Category.GRADIENTS] == 2 * N == 16_060_522_496
    torchtitan = estimate(_workload(precision="bf16", recompute="full", grad_accum=2, framework="torchtitan"))
    forward = next(p for p in torchtitan.phases if p.name == "forward")
    assert forward.breakdown[Category.GRADIENTS] == 2 * N // 8  # sharded gradients of the first micro-step
