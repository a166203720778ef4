"""The estimator's step replay, request by request as the pattern is written
(``reserved.replayed_slack``: ``step_pattern(..., into=replaying_pattern(settings))``), gives to the
byte the peaks of the full replay of the finished pattern (``pattern_peaks(step_pattern(...))``,
every event through ``CachingAllocatorModel``): on the agreement set's workloads
(``tests/simulator/test_agreement.py``) and on fuzzed training workloads (every method, shard kind,
recompute, optimizer, framework, pipeline stages, and allocator settings), for the whole step and for
the vocabulary-sized part alone (``layers=0``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vramlens.allocator.pattern import pattern_peaks
from vramlens.allocator.replaying import replaying_pattern
from vramlens.errors import InputError
from vramlens.estimator.layout import param_layout
from vramlens.estimator.quantities import stage_memory
from vramlens.estimator.reserved import allocator_settings, training_loss_script
from vramlens.estimator.step_pattern import step_pattern
from vramlens.estimator.step_shape import step_shape
from vramlens.model.families import parse_config
from vramlens.model.resolve import load_model
from vramlens.resolve.context import resolve_training
from vramlens.workload.load import load_workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simulator"))

from test_agreement import _CASES, _VARIANTS
from test_terms_sum import training

from family_configs import HYBRID_CONFIGS

CONFS = ("", "", "expandable_segments:True", "max_split_size_mb:128", "roundup_power2_divisions:4")


def _check(spec: Any, data: dict[str, Any]) -> int:
    """Compare the two replays on every stage of the workload, whole step and vocabulary part;
    returns how many patterns were compared."""
    workload = load_workload({**data, "model": spec})
    ctx = resolve_training(spec, workload)
    layout = param_layout(ctx)
    settings = allocator_settings(workload.alloc_conf)
    micro_steps = min(workload.grad_accum, 2)
    compared = 0
    for stage in layout.stages:
        mem = stage_memory(ctx, stage, layout.targets)
        loss = training_loss_script(ctx, mem, layout.targets)
        whole = step_shape(ctx, mem, layout.targets)
        for shape, layers in ((whole, whole.layers), (step_shape(ctx, mem, layout.targets, layers=False), 0)):
            written = step_pattern(shape, loss, layers=layers, micro_steps=micro_steps)
            sink = replaying_pattern(settings)
            step_pattern(shape, loss, layers=layers, micro_steps=micro_steps, into=sink)
            assert sink.peaks() == pattern_peaks(written, settings), (data, stage.name, layers)
            compared += 1
    return compared


@pytest.mark.parametrize(
    ("model", "variant"),
    [
        pytest.param(*case, marks=() if i % 9 == 0 else (pytest.mark.slow,), id="-".join(case))
        for i, case in enumerate(_CASES)
    ],
)
def test_the_agreement_set_replays_to_the_byte(model: str, variant: str) -> None:
    data = {"batch": 1, "framework": "hf", **_VARIANTS[variant]}
    assert _check(load_model(model), data) == 2  # the whole step and the vocabulary part


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(training(), st.sampled_from(CONFS))
def test_fuzzed_training_workloads_replay_to_the_byte(case: tuple[str, dict[str, Any]], conf: str) -> None:
    hybrid, data = case
    data = {**data, "alloc_conf": conf, "batch": min(data["batch"], 8)}
    try:
        spec = (
            parse_config({**HYBRID_CONFIGS[hybrid], "max_position_embeddings": 4096})
            if hybrid
            else load_model(data["model"])
        )
        _check(spec, data)
    except InputError:
        assume(False)  # an inconsistent draw (degrees that do not divide the GPUs, seq beyond the model)
