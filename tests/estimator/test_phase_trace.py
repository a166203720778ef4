"""The phases' trace (``estimator/phase_trace.py``): traced at one size, at another it gives the
phases ``training_phases`` makes there - names, notes, bytes and breakdowns - or refuses (a guard
fails) and never anything else; at the size it was traced at it always describes them (fuzzed
training workloads); a traced value refuses what a trace cannot replay."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_errors import VALID_WORKLOADS

from vramlens.errors import InputError
from vramlens.estimator.layout import param_layout
from vramlens.estimator.phase_trace import Untraceable, trace_phases
from vramlens.estimator.quantities import stage_memory, stage_plan
from vramlens.estimator.step_phases import training_phases
from vramlens.model.resolve import load_model
from vramlens.resolve.context import resolve_training
from vramlens.workload.load import load_workload

MODELS = ("llama-3.1-8b", "qwen2.5-0.5b", "mixtral-8x7b", "gemma-2-2b", "gpt-oss-20b")
#: (traced, refused) comparisons over the draws.
SEEN = {"described": 0, "refused": 0}


def _stages(model: str, data: dict) -> list:
    spec = load_model(model)
    ctx = resolve_training(spec, load_workload({**data, "model": spec}))
    layout = param_layout(ctx)
    found = []
    for stage in layout.stages:
        plan = stage_plan(ctx, stage, layout.targets)
        terms = stage_memory(ctx, stage, layout.targets, plan)
        numbers = stage_memory(ctx, stage, layout.targets, plan, terms=False)
        found.append((ctx, terms, numbers))
    return found


def _phases(ctx: object, mem: object) -> list[tuple[object, ...]]:
    return [(p.name, p.note, p.allocated_bytes, list(p.breakdown.items())) for p in training_phases(ctx, mem)]  # type: ignore[arg-type]


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(VALID_WORKLOADS, st.sampled_from(MODELS), st.sampled_from([128, 1024, 4096]), st.integers(1, 4))
def test_a_trace_gives_the_phases_or_refuses(data: dict, model: str, seq: int, batch: int) -> None:
    sizes = [(batch, seq), (batch + 3, seq // 2 + 1), (1, 4 * seq)]
    try:
        runs = [_stages(model, {**data, "batch": b, "seq": s}) for b, s in sizes]
    except InputError:
        assume(False)
        raise
    for index, (ctx, mem, _) in enumerate(runs[0]):
        trace = trace_phases(ctx, mem)
        assume(trace is not None)
        assert trace is not None
        for run in runs:
            at, terms, at_numbers = run[index]
            found = trace.phases_of(at_numbers)
            if found is None:
                assert run is not runs[0]
                SEEN["refused"] += 1
                continue
            values, phases = found
            made = [(n, note, b, list(trace.breakdown(i, values).items())) for i, (n, note, b) in enumerate(phases)]
            assert made == _phases(at, terms)
            SEEN["described"] += 1


def test_a_traced_value_refuses_what_a_trace_cannot_replay() -> None:
    spec = load_model("qwen2.5-0.5b")
    ((ctx, mem, _),) = _stages("qwen2.5-0.5b", {"batch": 1, "seq": 256})
    trace = trace_phases(ctx, mem)
    assert trace is not None and trace.phases_of(mem) is not None
    probe = trace_phases.__globals__["_input"](trace_phases.__globals__["_Recorder"](1), 0, 7)
    for use in (hash, int, float, lambda x: x / 2, lambda x: f"{x}", lambda x: x * 0.5, lambda x: x // 0):
        with pytest.raises(Untraceable):
            use(probe)
    assert (probe // 2).value == 3 and (probe * 3 - 1).value == 20 and spec is not None
