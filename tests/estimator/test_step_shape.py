"""The allocator requests of a step (``estimator/step_shape.py``): a frozen, unquantized base's
weights are requested tensor by tensor at their own sizes, as ``from_pretrained`` makes them.

Before, the layers shared the stage's frozen bytes, the final norm's included: every weight came
out a few bytes larger than it is (Llama-3.2-1B's 32 MiB MLP weights 70 bytes over), so each
took a segment rounded up to the next 2 MiB, and a LoRA step replayed 110 MiB more reserved at
load than the simulator's replay of the real code (``reserved_replay: true`` +10.7% for LoRA on
the tied head with recompute; ``tests/estimator/test_lora_head.py``)."""

from __future__ import annotations

import pytest

from vramlens.estimator.layout import param_layout
from vramlens.estimator.quantities import stage_memory
from vramlens.estimator.step_shape import step_shape
from vramlens.model.resolve import load_model
from vramlens.resolve.context import resolve_training
from vramlens.workload.load import load_workload


def _shape(model: str, **keys: object) -> tuple[object, object, object]:
    spec = load_model(model)
    workload = load_workload({"model": spec, "batch": 1, "seq": 512, "framework": "hf", **keys})
    ctx = resolve_training(spec, workload)
    layout = param_layout(ctx)
    stage = layout.stages[0]
    return ctx, stage, step_shape(ctx, stage_memory(ctx, stage, layout.targets), layout.targets)


@pytest.mark.parametrize(
    ("model", "keys"),
    [
        ("llama-3.2-1b", {"method": "lora", "precision": "bf16", "lora": {"targets": ["lm_head"]}}),
        ("qwen2.5-0.5b", {"method": "lora", "precision": "bf16"}),
        ("llama-3.2-1b", {"method": "lora", "precision": "fp32"}),
    ],
)
def test_a_frozen_bases_weights_are_requested_at_their_own_sizes(model: str, keys: dict[str, object]) -> None:
    ctx, stage, shape = _shape(model, **keys)
    spec, width = ctx.spec, int(ctx.frozen_bytes)  # type: ignore[attr-defined]
    h, kv = spec.hidden_size, spec.num_kv_heads * spec.head_dim
    weights = set(shape.layer_params[0])  # type: ignore[attr-defined]
    assert {h * h * width, h * kv * width, h * spec.mlp.intermediate_size * width} <= weights
    assert all(size % width == 0 for size in weights)
    # What is outside the layers and the vocabulary matrices (the final norm) is a tensor of its own,
    # and the load requests the stage's frozen bytes, no more and no less.
    layers = sum(shape.layer_params[0]) * stage.layers  # type: ignore[attr-defined]
    assert layers + sum(shape.edge_params) == int(stage.frozen_bytes)  # type: ignore[attr-defined]
    assert h * width in shape.edge_params  # type: ignore[attr-defined]


def test_a_quantized_bases_layers_share_its_frozen_bytes() -> None:
    _, stage, shape = _shape("llama-3.2-1b", method="qlora", precision="bf16")
    layers = sum(shape.layer_params[0]) * stage.layers  # type: ignore[attr-defined]
    assert layers + sum(shape.edge_params) == pytest.approx(stage.frozen_bytes, rel=1e-4)  # type: ignore[attr-defined]


def test_no_layer_runs_backward_when_only_the_head_trains() -> None:
    # LoRA on lm_head alone, no recompute: nothing below the head needs a gradient, so autograd
    # makes no hidden-state gradient and runs no layer's backward (the simulator's timeline of
    # PEFT's step has none between the head's backward and the optimizer step).
    from dataclasses import replace

    from vramlens.estimator.reserved import training_loss_script
    from vramlens.estimator.step_pattern import step_pattern

    spec = load_model("llama-3.2-1b")
    keys = {"method": "lora", "precision": "bf16", "lora": {"targets": ["lm_head"]}}
    workload = load_workload({"model": spec, "batch": 1, "seq": 512, "framework": "hf", **keys})
    ctx = resolve_training(spec, workload)
    layout = param_layout(ctx)
    mem = stage_memory(ctx, layout.stages[0], layout.targets)
    shape = step_shape(ctx, mem, layout.targets)
    assert not shape.below_head and mem.working_bytes == 0
    loss = training_loss_script(ctx, mem, layout.targets)

    def hidden_requests(each: object) -> int:
        events = step_pattern(each, loss, layers=shape.layers).events  # type: ignore[arg-type]
        return sum(1 for nbytes, _, _ in events if nbytes == shape.hidden)

    # Two steps, each one hidden-state gradient at the head and one per layer.
    assert hidden_requests(replace(shape, below_head=True)) - hidden_requests(shape) == 2 * (shape.layers + 1)
