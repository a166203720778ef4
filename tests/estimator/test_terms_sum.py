"""The terms of an estimate add up to its peak, exactly, at every level: a property over fuzzed
workloads (catalog models with MoE and MLA, hybrid families, training with every method, shard
kind, recompute and offload, inference with transformers and vLLM), and the README's example."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vramlens.errors import InputError
from vramlens.estimator import estimate, estimate_resolved
from vramlens.hardware import resolve_gpu
from vramlens.model.families import parse_config
from vramlens.model.resolve import load_model
from vramlens.result.report import LEVELS, MemoryReport
from vramlens.workload.load import load_workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))

from test_errors import VALID_WORKLOADS

from family_configs import HYBRID_CONFIGS

TRAIN_MODELS = ["llama-3.1-8b", "qwen2.5-0.5b", "gemma-2-2b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"]
TRAIN_MODELS += ["gpt-oss-20b", "phi-3-mini", "gpt2", "llama-3.2-1b", "falcon-7b"]
HYBRIDS = sorted(HYBRID_CONFIGS)
INFER_GPUS = [None, "rtx-4090", "a100-80gb", "h100-80gb", "h200"]


@st.composite
def training(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A training workload from the estimator fuzz (``test_errors.VALID_WORKLOADS``), on a catalog model
    or, one in five, a small hybrid (Mamba / linear-attention) family."""
    data = draw(VALID_WORKLOADS)
    model = draw(st.sampled_from(TRAIN_MODELS))
    if data["method"] != "full":
        data["quant"] = draw(st.sampled_from(["none", "nf4", "nf4-dq", "gptq-int4", "awq-int4"]))
    data["seq"] = draw(st.sampled_from([128, 512, 1024, 2048, 4096]))
    if draw(st.integers(0, 4)) == 4:
        return draw(st.sampled_from(HYBRIDS)), data | {"model": "llama-3.1-8b", "seq": 256}
    return "", data | {"model": model}


@st.composite
def inference(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """An inference workload: transformers generate() or vLLM, tensor/pipeline parallel, k-bit weights."""
    engine = draw(st.sampled_from(["hf", "vllm"]))
    tp, pp = draw(st.sampled_from([(1, 1), (2, 1), (1, 2), (4, 1)]))
    data: dict[str, Any] = {
        "mode": "infer",
        "model": draw(st.sampled_from(TRAIN_MODELS)),
        "engine": engine,
        "batch": draw(st.integers(1, 64)),
        "seq": draw(st.sampled_from([128, 512, 1024, 2048])),
        "context": draw(st.sampled_from([1024, 4096])),
        "quant": draw(st.sampled_from(["none", "none", "awq-int4", "fp8", "nf4"])),
        "parallel": {"tp": tp, "pp": pp, "gpus": tp * pp},
        "gpu": draw(st.sampled_from(INFER_GPUS)),
    }
    if engine == "vllm":
        data["max_num_seqs"] = draw(st.sampled_from([8, 256]))
    if draw(st.integers(0, 4)) == 4:
        return draw(st.sampled_from(HYBRIDS)), data | {"model": "llama-3.1-8b", "context": 256, "seq": 128}
    return "", data


WORKLOADS = st.one_of(training(), training(), training(), inference())


def run(case: tuple[str, dict[str, Any]]) -> MemoryReport:
    """The estimate of a drawn case: a catalog model, or a hybrid family's small config."""
    hybrid, data = case
    if not hybrid:
        return estimate(data)
    spec = parse_config({**HYBRID_CONFIGS[hybrid], "max_position_embeddings": 4096})
    workload = load_workload(data)
    return estimate_resolved(spec, workload, resolve_gpu(workload.gpu) if workload.gpu else None)


def assert_terms_make_the_peaks(report: MemoryReport) -> None:
    """Each level's peak terms add up to that level's figure, every phase's terms to its allocated bytes and
    its breakdown, and every term is a named, positive quantity that says when it is alive."""
    for level in LEVELS:
        terms = report.peak_terms(level)
        assert terms, level
        assert sum(term.bytes for term in terms) == report.level_bytes(level), level
    for phase in report.phases:
        assert sum(term.bytes for term in phase.terms) == phase.allocated_bytes, phase.name
        by_category: dict[Any, int] = {}
        for term in phase.terms:
            by_category[term.category] = by_category.get(term.category, 0) + term.bytes
        assert by_category == dict(phase.breakdown), phase.name
    for term in report.peak_terms("device"):
        assert term.bytes > 0 and term.name and term.formula and term.alive, term
        assert term.name.lower() not in ("other", "unexplained", "rest"), term


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(WORKLOADS)
def test_the_terms_at_the_peak_add_up_to_every_level(case: tuple[str, dict[str, Any]]) -> None:
    try:
        report = run(case)
    except InputError:
        assume(False)  # an inconsistent draw (e.g. degrees that do not divide the GPUs): not a workload
        raise
    assert_terms_make_the_peaks(report)


def test_the_readme_lora_example_is_explained_to_the_byte() -> None:
    # README: `vramlens estimate llama-3.1-8b --method lora --recompute full --explain`. Before issue 23 its
    # seven terms added up to 0.83x of the allocated peak (5.7 GiB had no term).
    report = estimate({"model": "llama-3.1-8b", "method": "lora", "recompute": "full"})
    assert_terms_make_the_peaks(report)
    names = [term.name for term in report.peak_terms("allocated")]
    assert "parameters" in names and any(name.startswith("cuBLAS workspace") for name in names)
    assert any("working set" in name or "logits" in name for name in names)
    allocator = report.peak_terms("reserved")[len(report.peak.terms) :]
    assert sum(term.bytes for term in allocator) == report.reserved_bytes - report.allocated_bytes > 0
    runtime = report.peak_terms("device")[len(report.peak_terms("reserved")) :]
    assert [term.name for term in runtime] == ["CUDA context"]


def test_a_phase_whose_terms_miss_its_bytes_is_refused() -> None:
    from vramlens.categories import Category
    from vramlens.result.report import PhaseMemory, Term

    term = Term(name="x", category=Category.TEMPORARY, bytes=6, explain="2 x 3 B", alive="at the loss")
    assert PhaseMemory.of_terms("forward", "", [term]).allocated_bytes == 6
    with pytest.raises(ValueError, match="add up to 6, not 7"):
        PhaseMemory(name="forward", allocated_bytes=7, breakdown={Category.TEMPORARY: 7}, terms=(term,))


def test_every_catalog_model_is_explained_in_training_and_inference() -> None:
    from vramlens.model.catalog import catalog_entries

    for entry in catalog_entries():
        name = entry.name
        spec = load_model(name)
        for data in ({"method": "lora"}, {"mode": "infer", "engine": "vllm", "gpu": "h200"}, {"mode": "infer"}):
            try:
                report = estimate({"model": name, **data})
            except InputError:
                continue
            assert_terms_make_the_peaks(report)
        assert spec.name
