"""The fast estimate (``estimator/fast_estimate.py``: figures from stage plans, a trace of the phases
and the vocabulary template, terms made when read) is the estimate made term by term: every figure,
phase, term, formula and note, over fuzzed training workloads (every method, shard kind, recompute,
offload, pipeline, optimizer, loss), each estimated at several sizes on one model whose memo holds
every earlier draw, against the same workload estimated on a model with an empty memo."""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
import weakref
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_errors import VALID_WORKLOADS

from vramlens.errors import InputError
from vramlens.estimator import estimate_resolved
from vramlens.estimator.phase_trace import PhaseTrace
from vramlens.model.resolve import load_model
from vramlens.model.spec import ModelSpec
from vramlens.result.presented import presented_later
from vramlens.result.report import MemoryReport
from vramlens.workload.load import load_workload

MODELS = ("llama-3.1-8b", "qwen2.5-0.5b", "mixtral-8x7b", "gemma-2-2b", "gpt-oss-20b", "llama-3-70b")
WARM: dict[str, ModelSpec] = {}
#: Fast estimates made by the draws so far (the test would compare nothing without them).
USED = {"fast": 0}


def _warm(model: str) -> ModelSpec:
    if model not in WARM:
        spec = copy.copy(load_model(model))
        spec.__dict__.pop("derived_cache", None)
        WARM[model] = spec
    return WARM[model]


def _report(spec: ModelSpec, data: dict[str, Any]) -> MemoryReport:
    return estimate_resolved(spec, load_workload({**data, "model": spec}), None)


def _figures(report: MemoryReport) -> str:
    """Everything a report says, formulas included, as text."""
    phases = [[term.to_dict() for term in phase.terms] for phase in report.phases]
    breakdowns = [[(c.value, b) for c, b in phase.breakdown.items()] for phase in report.phases]
    return json.dumps([report.to_dict(), phases, breakdowns, repr(report.safe)], sort_keys=True, default=str)


def _cold(model: str, data: dict[str, Any]) -> str:
    spec = load_model(model)
    spec.derived_cache.clear()
    return _figures(_report(spec, data))


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(VALID_WORKLOADS, st.sampled_from(MODELS), st.sampled_from([128, 512, 2048]), st.integers(1, 3))
def test_the_fast_estimate_is_the_estimate_made_term_by_term(data: dict, model: str, seq: int, batch: int) -> None:
    sizes = [(batch, seq, 1), (batch + 1, 2 * seq, 1), (batch + 2, seq + 64, 1), (2 * batch, seq // 2, 2)]
    sizes += [(batch, seq + 128, 2), (batch + 3, seq, 2)]  # the third of each grad_accum is fast
    draws = [{**data, "batch": b, "seq": s, "grad_accum": g} for b, s, g in sizes]
    try:
        colds = [_cold(model, draw) for draw in draws]
    except InputError:
        assume(False)  # an inconsistent draw (degrees that do not divide the GPUs, seq beyond the model)
        raise
    warm = _warm(model)
    for draw, cold in zip(draws, colds, strict=True):
        report = _report(warm, draw)
        USED["fast"] += "presented" in type(report).__dict__
        assert _figures(report) == cold


def test_the_fast_estimate_is_used_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above compares fast estimates (from the third size of a workload on), and a
    fast report whose figures were not the term-by-term report's would be refused when read."""
    spec = copy.copy(load_model("llama-3.1-8b"))
    spec.__dict__.pop("derived_cache", None)
    data = {"method": "lora", "parallel": {"gpus": 8, "shard": "zero3"}, "recompute": "full"}
    reports = [_report(spec, {**data, "batch": 1 + i, "seq": 1024 + 64 * i}) for i in range(4)]
    assert [hasattr(type(r), "presented") for r in reports] == [False, False, True, True]
    assert _figures(reports[3]) == _cold("llama-3.1-8b", {**data, "batch": 4, "seq": 1024 + 192})

    def shifted(self: PhaseTrace, mem: Any) -> Any:
        found = phases_of(self, mem)
        if found is not None:
            values, phases = found
            found = values, [(name, note, allocated + 512) for name, note, allocated in phases]
        return found

    phases_of = PhaseTrace.phases_of
    monkeypatch.setattr(PhaseTrace, "phases_of", shifted)
    wrong = _report(spec, {**data, "batch": 5, "seq": 2048})
    assert hasattr(type(wrong), "presented")
    with pytest.raises((AssertionError, ValueError), match=r"differ|adds up"):
        _ = wrong.terms


def test_a_presented_report_keeps_the_frozen_dataclass_api() -> None:
    """``replace``, equality and the lazy fields of a report whose terms are made when read."""
    made = _report(load_model("qwen2.5-0.5b"), {"batch": 1, "seq": 256})
    fields = {f.name: getattr(made, f.name) for f in dataclasses.fields(made) if f.name not in ("terms",)}
    for name in ("allocator_terms", "assumptions"):
        del fields[name]
    later = presented_later(lambda: made, fields)
    assert later.assumptions == made.assumptions and later.terms == made.terms
    assert dataclasses.replace(later, gpu=None).allocated_bytes == made.allocated_bytes
    with pytest.raises(dataclasses.FrozenInstanceError):
        later.allocated_bytes = 1  # type: ignore[misc]


def test_a_dropped_fast_report_is_freed_at_once_and_its_kept_phases_still_give_their_terms() -> None:
    """No reference cycle keeps a fast report alive for the garbage collector (a planner's sweep makes
    thousands), and a phase kept without its report makes its terms from the report made term by term."""
    spec = copy.copy(load_model("llama-3.1-8b"))
    spec.__dict__.pop("derived_cache", None)
    data = {"method": "lora", "parallel": {"gpus": 8, "shard": "zero3"}, "recompute": "full"}
    sizes = {"batch": 3, "seq": 1024 + 128}
    for i in range(2):
        _report(spec, {**data, "batch": 1 + i, "seq": 1024 + 64 * i})
    collecting = gc.isenabled()
    gc.disable()
    try:
        fast = _report(spec, {**data, **sizes})
        assert hasattr(type(fast), "presented")
        kept, gone = fast.phases[-1], weakref.ref(fast)
        del fast
        assert gone() is None
    finally:
        if collecting:
            gc.enable()
    cold = load_model("llama-3.1-8b")
    cold.derived_cache.clear()
    made = _report(cold, {**data, **sizes}).phases[-1]
    assert [term.to_dict() for term in kept.terms] == [term.to_dict() for term in made.terms]
    assert kept.breakdown == made.breakdown


def test_the_benchmark_sweep_is_the_estimate_made_term_by_term() -> None:
    """``benchmarks/speed.py``'s sweep (70B, LoRA, ZeRO-3, full recompute): batch x grad_accum x seq
    points in its order on one warm model, each fast one (traced phases, vocabulary template, slack
    replayed once per set of sizes) equal to the same workload estimated from an empty memo."""
    spec = copy.copy(load_model("llama-3-70b"))
    spec.__dict__.pop("derived_cache", None)
    data = {
        "method": "lora",
        "lora": {"rank": 16, "targets": "all-linear"},
        "recompute": "full",
        "parallel": {"gpus": 8, "shard": "zero3"},
        "gpu": "a100-80gb",
    }
    points = [(1 + i % 8, 1 + i // 8 % 4, 512 + i // 32 + 7 * (i % 5)) for i in range(0, 2400, 53)]
    fast = 0
    for batch, accumulation, seq in points:
        draw = {**data, "batch": batch, "grad_accum": accumulation, "seq": seq}
        report = _report(spec, draw)
        fast += hasattr(type(report), "presented")
        assert _figures(report) == _cold("llama-3-70b", draw)
    assert fast >= len(points) - 8  # all but the first two of each grad_accum
