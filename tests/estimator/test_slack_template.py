"""The vocabulary template (``estimator/slack_template.py``) and the symbols it is made with
(``estimator/size_symbols.py``): traced at one size, the template gives at another size the very
requests ``step_pattern(step_shape(..., layers=False), training_loss_script(...))`` writes there
(fuzzed workloads); its runs are the events written out; a symbol refuses every use but addition,
subtraction and an integer factor."""

from __future__ import annotations

import operator
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_errors import VALID_WORKLOADS

from vramlens.allocator.pattern import Repeat, pattern_peaks
from vramlens.errors import InputError
from vramlens.estimator.layout import param_layout
from vramlens.estimator.quantities import stage_memory
from vramlens.estimator.reserved import allocator_settings, training_loss_script
from vramlens.estimator.size_symbols import Linear, SizeDependent, symbols
from vramlens.estimator.slack_template import runs, sized_inputs, vocabulary_template
from vramlens.estimator.step_pattern import step_pattern
from vramlens.estimator.step_shape import step_shape
from vramlens.model.resolve import load_model
from vramlens.resolve.context import resolve_training
from vramlens.workload.load import load_workload

MODELS = ("llama-3.1-8b", "qwen2.5-0.5b", "mixtral-8x7b", "gemma-2-2b", "llama-3-70b")


def _stages(model: str, data: dict) -> list:
    spec = load_model(model)
    ctx = resolve_training(spec, load_workload({**data, "model": spec}))
    layout = param_layout(ctx)
    return [(ctx, stage_memory(ctx, stage, layout.targets), layout.targets) for stage in layout.stages]


def _normal(events: list[tuple[int, int, int]]) -> list[tuple[object, ...]]:
    """Events with each free naming the allocation it frees by its order (keys may differ)."""
    order: dict[int, int] = {}
    found: list[tuple[object, ...]] = []
    for size, key, stream in events:
        if size > 0:
            order[key] = sum(1 for event in found if event[0] != "free")
            found.append((size, stream))
        elif key in order:
            found.append(("free", order[key]))
    return found


def _written_out(parts: list) -> list[tuple[int, int, int]]:
    return [e for part in parts for e in (list(part.events) * part.count if isinstance(part, Repeat) else part)]


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(VALID_WORKLOADS, st.sampled_from(MODELS), st.sampled_from([256, 1024, 4096]), st.integers(1, 4))
def test_the_template_gives_the_requests_step_pattern_writes(data: dict, model: str, seq: int, batch: int) -> None:
    first, second = {**data, "seq": seq, "batch": batch}, {**data, "seq": 2 * seq + 8, "batch": batch + 1}
    try:
        traced, other = _stages(model, first), _stages(model, second)
    except InputError:
        assume(False)
        raise
    for (ctx, mem, targets), (at, mem_at, _) in zip(traced, other, strict=True):
        micro = min(ctx.workload.grad_accum, 2)
        settings_ = allocator_settings(ctx.workload.alloc_conf)
        template = vocabulary_template(ctx, mem, targets, micro, settings_, {})
        assume(template is not None)
        assert template is not None
        shape = step_shape(at, mem_at, targets, layers=False)
        written = step_pattern(shape, training_loss_script(at, mem_at, targets), layers=0, micro_steps=micro)
        made = _written_out(template.requests(sized_inputs(at, mem_at)))
        assert _normal(made) == _normal(written.events)
        assert template.slack(at, mem_at, settings_) == max(0, pattern_peaks(written, settings_).slack_bytes)


def test_runs_write_out_to_the_events() -> None:
    rng = random.Random(3)
    for _ in range(200):
        block = [(rng.randint(1, 99), 0, 0), (rng.randint(1, 99), 1, 0), (-1, 0, 0), (-1, 1, 0)]
        copies = rng.randint(1, 4)
        events, key = [(5, 100, 0)], 0
        for _ in range(copies):
            events += [(size, k + key, s) for size, k, s in block]
            key += 2
        events.append((7, 200, 0))
        parts = runs(events)
        written = [e for stretch, count in parts for e in (list(stretch) * max(count, 1))]
        assert _normal(written) == _normal(events)
        assert (copies >= 2) == any(count for _, count in parts)


@pytest.mark.parametrize(
    "use",
    [
        lambda x: x < 1, lambda x: x == x, lambda x: bool(x), lambda x: hash(x), lambda x: int(x),
        lambda x: x / 2, lambda x: x // 2, lambda x: x * 0.5, lambda x: f"{x}", lambda x: x % 3,
        lambda x: max(x, 1), lambda x: range(x), lambda x: x * x,
    ],
)  # fmt: skip
def test_a_symbol_refuses_every_other_use(use: object) -> None:
    (x,) = symbols(1)
    with pytest.raises((SizeDependent, TypeError)):
        use(x)  # type: ignore[operator]


def test_a_symbol_adds_and_scales_exactly() -> None:
    x, y = symbols(2)
    made = 3 * (x + 2) - y * 4 + 7 - x // 1
    assert isinstance(made, Linear)
    assert made.evaluate((10, 5)) == 3 * 12 - 20 + 7 - 10
    assert 0 * x == 0 and operator.sub(x, x).terms == ()
