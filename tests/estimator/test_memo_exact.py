"""What the estimator memoizes on the resolved model (the parts that read neither batch nor
sequence length: :class:`~vramlens.estimator.memo_keys.SizeFreeInputs`, the runtime parts) never
changes a figure: an estimate computed with the memo filled by other workloads on the same model
is the estimate computed from an empty memo, term for term and formula for formula, over fuzzed
training workloads (every method, shard kind, recompute, offload, pipeline, optimizer)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_errors import VALID_WORKLOADS

from vramlens.errors import InputError
from vramlens.estimator import estimate_resolved
from vramlens.model.resolve import load_model
from vramlens.model.spec import ModelSpec
from vramlens.resolve._memo import memo
from vramlens.workload.load import load_workload

MODELS = ("llama-3.1-8b", "qwen2.5-0.5b", "mixtral-8x7b", "gemma-2-2b", "gpt-oss-20b", "deepseek-v3")
#: Per model, a copy whose memo is never emptied: it holds the parts of every workload drawn so far.
WARM: dict[str, ModelSpec] = {}


def _warm(model: str) -> ModelSpec:
    if model not in WARM:
        spec = copy.copy(load_model(model))
        spec.__dict__.pop("derived_cache", None)  # its own memo, not the catalog spec's
        WARM[model] = spec
    return WARM[model]


def _figures(spec: ModelSpec, data: dict[str, Any]) -> str:
    """Everything an estimate says, formulas included, as text."""
    report = estimate_resolved(spec, load_workload({**data, "model": spec}), None)
    phases = [[term.to_dict() for term in phase.terms] for phase in report.phases]
    return json.dumps([report.to_dict(), phases], sort_keys=True, default=str)


def _cold(spec: ModelSpec, data: dict[str, Any]) -> str:
    """The figures from an empty memo (the spec's memo is emptied first)."""
    spec.derived_cache.clear()
    return _figures(spec, data)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(VALID_WORKLOADS, st.sampled_from(MODELS), st.sampled_from([128, 512, 2048]), st.integers(1, 3))
def test_a_memoized_estimate_is_the_estimate_from_scratch(data: dict, model: str, seq: int, batch: int) -> None:
    first, second = {**data, "seq": seq, "batch": batch}, {**data, "seq": 2 * seq, "batch": batch + 1}
    try:
        cold = _cold(load_model(model), second)
    except InputError:
        assume(False)  # an inconsistent draw (degrees that do not divide the GPUs, seq beyond the model)
        raise
    warm = _warm(model)
    _figures(warm, first)  # this workload's size-free parts at other sizes, beside every earlier draw's
    assert _figures(warm, second) == cold


def test_the_memo_is_used() -> None:
    """The check above compares something: a second estimate at other sizes finds its parts memoized."""
    spec = load_model("llama-3.1-8b")
    spec.derived_cache.clear()
    _figures(spec, {"method": "lora", "seq": 512})
    keys = {type(key).__name__ for key in spec.derived_cache}
    assert {"SizeFreeInputs", "RuntimeInputs"} <= keys
    size_free = [key for key in spec.derived_cache if type(key).__name__ == "SizeFreeInputs"]
    calls: list[object] = []
    memo(spec, size_free[0], lambda: calls.append(1))
    assert not calls
