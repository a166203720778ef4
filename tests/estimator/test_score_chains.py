"""Eager attention's score chain in a layer's forward, in the step pattern
(``estimator/score_chains.py``, ``step_layers.eager_chain``).

A layer that keeps eager attention's tensors (eager attention, or SDPA's math backend on CUDA: fp32
queries with grouped KV heads, as in QLoRA without autocast) makes its ``heads x s x s`` scores, the
scaled and the masked copies and the probabilities one after the other; the probabilities stay for
backward, the others are freed and the MLP's tensors land in the segments they leave. Written as the
kept probabilities alone, the replay fragmented the segments unlike the real step: QLoRA on the H200
(``validation/measured/2026-11-27-h200``) was 4.2% (Qwen2.5-3B) under its measured reserved; with the
chain, within 1%. The simulator's replay of the real code is the yardstick here
(``tests/simulator/test_agreement.py``: ``test_math_backend_layers_reserved_within_1_percent``).
"""

from __future__ import annotations

import pytest

from vramlens.estimator.eager_attention import eager_score_chain
from vramlens.estimator.layout import param_layout
from vramlens.estimator.quantities import stage_memory
from vramlens.estimator.score_chains import forward_score_chain
from vramlens.estimator.step_layers import eager_chain
from vramlens.estimator.step_shape import step_shape
from vramlens.model.resolve import load_model
from vramlens.resolve.context import resolve_training
from vramlens.workload.load import load_workload


def _shape(model: str, **keys: object) -> tuple[object, object]:
    spec = load_model(model)
    workload = load_workload({"model": spec, "batch": 1, "seq": 512, "framework": "hf", **keys})
    ctx = resolve_training(spec, workload)
    layout = param_layout(ctx)
    mem = stage_memory(ctx, layout.stages[0], layout.targets)
    return step_shape(ctx, mem, layout.targets), mem


@pytest.mark.parametrize(
    ("keys", "chained"),
    [
        ({"method": "qlora", "precision": "bf16"}, True),  # fp32 queries, grouped heads: the math backend
        ({"method": "full", "precision": "fp32"}, True),
        ({"method": "full", "precision": "bf16", "attention": "eager"}, True),
        ({"method": "full", "precision": "bf16"}, False),  # a fused kernel keeps no scores
        ({"method": "lora", "precision": "bf16", "attention": "eager"}, False),  # the LoRA layer script has its own
    ],
)
def test_the_layers_that_keep_scores_write_the_chain(keys: dict[str, object], chained: bool) -> None:
    shape, mem = _shape("qwen2.5-0.5b", **keys)
    chains = shape.eager_chains  # type: ignore[attr-defined]
    assert any(chains) is chained
    if chained:
        # The chain stands for the kept parts' tensors: what it leaves alive is their bytes.
        chain = next(each for each in chains if each is not None)
        saved = shape.saved[0]  # type: ignore[attr-defined]
        alive: dict[str, int] = {}
        for op, name, nbytes in chain.steps:
            if op == "+":
                alive[name] = nbytes
            else:
                del alive[name]
        assert sum(alive.values()) == sum(saved[i] for i in chain.replaced)
    # The forward's working set holds the score tensors only where no chain writes them.
    besides = mem.forward_besides_scores_bytes if chained else mem.forward_working_bytes  # type: ignore[attr-defined]
    assert shape.forward_working == besides  # type: ignore[attr-defined]


def test_a_chain_that_does_not_leave_the_kept_bytes_alive_is_not_written() -> None:
    steps = (("+", "scores", 8), ("+", "probs", 8), ("-", "scores", 0))
    named = [("attention q", [4]), ("attention probabilities", [8]), ("mlp", [2, 2])]
    chain = eager_chain(steps, named)
    assert chain is not None and chain.replaced == (1,)
    assert eager_chain(steps, [("attention q", [4]), ("attention probabilities", [6])]) is None
    assert eager_chain(steps, [("attention q", [4])]) is None
    assert eager_chain((), named) is None


def test_soft_capped_scores_replace_both_kept_parts() -> None:
    """Gemma 2: autograd keeps the soft-cap's tanh beside the probabilities."""
    steps = (("+", "tanh", 4), ("+", "probs", 4))
    named = [("attention probabilities", [4]), ("attention soft-cap tanh", [4]), ("mlp", [2])]
    chain = eager_chain(steps, named)
    assert chain is not None and chain.replaced == (0, 1)


def test_the_forward_chain_is_eager_attentions_with_grad() -> None:
    spec = load_model("qwen2.5-0.5b")
    workload = load_workload(
        {"model": spec, "batch": 1, "seq": 512, "framework": "hf", "method": "qlora", "precision": "bf16"}
    )
    ctx = resolve_training(spec, workload)
    from vramlens.estimator.recompute import layer_kind, layer_recipe, train_state

    state = train_state(ctx, param_layout(ctx).targets)
    kind = layer_kind(spec.layers[0], 512)
    recipe = layer_recipe(ctx, state, [])
    expected = eager_score_chain(spec, recipe.style, compute_bytes=4, autocast=False, seq=512, tokens=512, grad=True)
    assert forward_score_chain(ctx, state, kind) == expected
    assert expected[-2:] == (("+", "probs", 4 * spec.num_heads * 512 * 512), ("-", "masked", 0))
