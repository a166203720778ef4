"""Autocast's weight copies in a full fine-tune of fp32 weights (``estimator/autocast_casts.py``).

Under autocast ``F.linear`` casts its weight and bias to bf16 once per forward (the autocast cache);
``F.embedding`` casts nothing (a lookup in the fp32 table) and a norm's elementwise product keeps its
weight's dtype. Each copy is saved for backward by its matmul, so it lives until that layer's backward:
in the first layer's backward, the last the backward reaches, only that layer's copies are left.

Before, the input embedding was counted as cast (Llama-3.1-8B: 0.98 GiB over in the forward) and every
layer's copies were counted alive in the first layer's backward, so a full mixed-bf16 fine-tune's
backward peak came out 9% above the simulation of transformers' step (7-8B models at 2048 tokens;
``tests/simulator/test_agreement.py``: ``test_full_mixed_precision_within_1_percent``).
"""

from __future__ import annotations

import pytest

from vramlens.estimator.layout import param_layout
from vramlens.estimator.quantities import stage_memory
from vramlens.model.modules import layer_linears
from vramlens.model.resolve import load_model
from vramlens.resolve.context import resolve_training
from vramlens.workload.load import load_workload


def _memory(model: str, **keys: object) -> tuple[object, object]:
    spec = load_model(model)
    workload = load_workload(
        {"model": spec, "batch": 1, "seq": 512, "method": "full", "precision": "mixed-bf16", **keys}
    )
    ctx = resolve_training(spec, workload)
    layout = param_layout(ctx)
    return spec, stage_memory(ctx, layout.stages[0], layout.targets)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen2.5-0.5b"])  # an untied head, a tied one
def test_the_copies_are_the_linears_and_the_head(model: str) -> None:
    spec, mem = _memory(model)
    linears = sum(
        s.in_features * s.out_features + s.out_features * s.bias
        for s in layer_linears(spec, spec.layers[0].kind_at(512))
    )
    head = spec.vocab_size * spec.hidden_size
    assert mem.casts_bytes == 2 * (len(spec.layers) * linears + head)  # type: ignore[attr-defined]
    assert mem.casts_last_layer_bytes == 2 * linears  # type: ignore[attr-defined]


def test_without_autocast_there_are_no_copies() -> None:
    _, mem = _memory("llama-3.2-1b", precision="bf16")
    assert mem.casts_bytes == mem.casts_last_layer_bytes == 0  # type: ignore[attr-defined]


def test_the_routed_experts_are_not_cast() -> None:
    """transformers 5 runs the routed experts' 3-D weights through ``grouped_mm``, on no autocast
    list: a Qwen3-30B-A3B layer's copies are its attention projections and its router."""
    spec, mem = _memory("qwen3-30b-a3b")
    attention = sum(s.in_features * s.out_features for s in layer_linears(spec, spec.layers[0].kind_at(512)))
    router = spec.moe.num_experts * spec.hidden_size  # type: ignore[union-attr]
    qk_norms = 2 * spec.head_dim  # trained, not cast, still counted (0.003% of the layer's copies)
    assert mem.casts_last_layer_bytes == 2 * (attention + router + qk_norms)  # type: ignore[attr-defined]
