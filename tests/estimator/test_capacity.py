"""Capacity answers (``max_batch``, ``max_context``, ``search_capacity``): the answer agrees with
:func:`vramlens.estimator` (it fits, one more does not unless the search limit is reached),
errors name the key, and the search evaluates few estimates."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vramlens
from vramlens.errors import InputError
from vramlens.estimator import capacity, estimate
from vramlens.estimator.capacity import MAX_SEARCH_BATCH, MAX_SEARCH_CONTEXT, max_batch, max_context, search_capacity
from vramlens.model.resolve import load_model

DENSE = ["llama-3.1-8b", "qwen2.5-7b", "gemma-2-9b-it", "mistral-7b"]
MODELS = [*DENSE, "mixtral-8x7b", "deepseek-v3"]
GPUS = ["rtx-4090", "l4", "a100-80gb", "h100-80gb", "h200"]
MAX_POSITIONS = {name: load_model(name).max_position_embeddings for name in MODELS}
#: 671B parameters: only fp8 weights over 8 ranks fit anything (an H200).
DEEPSEEK: dict[str, Any] = {"model": "deepseek-v3", "gpu": "h200", "quant": "fp8", "parallel": {"tp": 8, "gpus": 8}}


@st.composite
def inference_workloads(draw: st.DrawFn) -> dict[str, Any]:
    """Inference workloads over catalog models, GPUs, engines, contexts and weight formats."""
    model = draw(st.sampled_from(MODELS))
    engine = draw(st.sampled_from(["hf", "vllm"]))
    context = min(draw(st.integers(512, 32768)), MAX_POSITIONS[model])
    workload: dict[str, Any] = {
        "model": model,
        "mode": "infer",
        "gpu": draw(st.sampled_from(GPUS)),
        "engine": engine,
        "context": context,
        "quant": draw(st.sampled_from(["none", "awq-int4"])),
    }
    if model == "deepseek-v3":
        workload |= {"quant": DEEPSEEK["quant"], "parallel": DEEPSEEK["parallel"]}
    if engine == "vllm":
        workload["max_num_seqs"] = draw(st.sampled_from([8, 256]))
    return workload


def expected_limit(workload: dict[str, Any], key: str) -> int:
    if key == "context":
        return MAX_SEARCH_CONTEXT if workload.get("allow_long_context") else MAX_POSITIONS[workload["model"]]
    if workload.get("mode") == "infer" and workload.get("engine") == "vllm":
        return int(workload.get("max_num_seqs", 256))
    return MAX_SEARCH_BATCH


def assert_consistent(workload: dict[str, Any], key: str) -> int:
    """The answer fits, one more does not (unless it is the limit), and 0 means 1 does not fit."""
    answer = search_capacity(workload, key)
    assert answer.key == key
    assert answer.limit == expected_limit(workload, key)
    n = answer.value
    assert 0 <= n <= answer.limit
    if n == 0:
        assert answer.report is None
        assert estimate(workload, **{key: 1}).fits is False
        return n
    at_n = estimate(workload, **{key: n})
    assert at_n.fits is True
    assert answer.report is not None and answer.report.fits is True
    assert answer.report.device_bytes == at_n.device_bytes
    assert answer.report.workload_dict[key] == n
    if n < answer.limit:
        assert estimate(workload, **{key: n + 1}).fits is False, f"{key} {n + 1} fits too"
    return n


@settings(max_examples=40, deadline=None)
@given(inference_workloads())
def test_max_batch_fits_and_one_more_does_not(workload: dict[str, Any]) -> None:
    n = assert_consistent(workload, "batch")
    assert max_batch(workload) == n


@settings(max_examples=40, deadline=None)
@given(inference_workloads(), st.sampled_from([1, 4, 8]))
def test_max_context_fits_and_one_more_does_not(workload: dict[str, Any], batch: int) -> None:
    workload = {key: value for key, value in workload.items() if key != "context"} | {"batch": batch}
    n = assert_consistent(workload, "context")
    assert max_context(workload) == n


@pytest.mark.parametrize(
    ("workload", "key"),
    [
        ({**DEEPSEEK, "engine": "vllm"}, "batch"),
        ({**DEEPSEEK, "engine": "hf"}, "batch"),
        ({"model": "mixtral-8x7b", "engine": "vllm", "gpu": "h100-80gb", "quant": "awq-int4"}, "context"),
        ({"model": "llama-3.1-8b", "engine": "hf", "gpu": "h100-80gb", "allow_long_context": True}, "context"),
        ({"model": "llama-3.1-8b", "engine": "vllm", "gpu": "rtx-4090", "max_num_seqs": 4}, "batch"),
    ],
)
def test_chosen_questions_are_consistent(workload: dict[str, Any], key: str) -> None:
    """Fixed cases that the random draw may miss: MLA over tp 8, the long-context cap, a small max_num_seqs."""
    n = assert_consistent({"mode": "infer", **workload}, key)
    assert n >= 1


def test_vllm_batch_stops_at_max_num_seqs() -> None:
    workload = {"model": "llama-3.1-8b", "mode": "infer", "engine": "vllm", "gpu": "h200", "max_num_seqs": 8}
    answer = search_capacity(workload, "batch")
    assert (answer.value, answer.limit) == (8, 8)
    with pytest.raises(InputError, match="max_num_seqs"):
        estimate(workload, batch=9)


def test_nothing_fits_gives_zero_and_no_report() -> None:
    workload = {"model": "mixtral-8x7b", "mode": "infer", "gpu": "l4", "context": 4096}
    answer = search_capacity(workload, "batch")
    assert (answer.value, answer.report) == (0, None)
    assert estimate(workload, batch=1).fits is False


def test_max_batch_of_a_training_workload_is_consistent() -> None:
    workload = {"model": "llama-3.1-8b", "mode": "train", "method": "lora", "gpu": "a100-80gb", "seq": 2048}
    n = assert_consistent(workload, "batch")
    assert n >= 1
    assert vramlens.max_batch(workload) == n


def test_overrides_are_applied_before_the_search() -> None:
    base = {"model": "llama-3.1-8b", "mode": "infer", "context": 4096}
    assert max_batch(base, gpu="h100-80gb") == max_batch(base | {"gpu": "h100-80gb"})
    assert max_batch(base, gpu="h100-80gb") > max_batch(base, gpu="l4") >= 1


def test_public_api_exports_the_answers() -> None:
    assert vramlens.max_batch is max_batch
    assert vramlens.max_context is max_context
    assert vramlens.CapacityAnswer is capacity.CapacityAnswer


@pytest.mark.parametrize("key", ["batch", "context"])
def test_no_gpu_is_an_input_error_naming_gpu(key: str) -> None:
    with pytest.raises(InputError, match=r"^gpu: "):
        search_capacity({"model": "llama-3.1-8b", "mode": "infer"}, key)
    with pytest.raises(InputError, match=r"^gpu: "):
        max_batch({"model": "llama-3.1-8b", "mode": "train"})


def test_max_context_of_a_training_workload_is_an_input_error_naming_mode() -> None:
    with pytest.raises(InputError, match=r"^mode: "):
        max_context({"model": "llama-3.1-8b", "mode": "train", "gpu": "h100-80gb"})


def test_unknown_answer_is_an_input_error() -> None:
    with pytest.raises(InputError, match="capacity"):
        search_capacity({"model": "llama-3.1-8b", "mode": "infer", "gpu": "h100-80gb"}, "seq")


def count_evaluations(workload: dict[str, Any], key: str) -> int:
    """Estimates the search evaluates (as the answer reports them)."""
    return search_capacity(workload, key).evaluations


@pytest.mark.parametrize(
    ("key", "workload"),
    [
        ("batch", {"model": "llama-3.1-8b", "engine": "hf", "gpu": "a100-80gb", "prompt": 2048, "generate": 512}),
        ("batch", {"model": "llama-3.1-70b", "engine": "vllm", "gpu": "h100-80gb", "parallel": {"tp": 4, "gpus": 4}}),
        ("context", {"model": "qwen2.5-7b", "engine": "hf", "gpu": "rtx-4090", "quant": "awq-int4"}),
        ("context", {"model": "llama-3.1-8b", "engine": "vllm", "gpu": "h200", "allow_long_context": True}),
        ("batch", {"model": "gemma-2-9b-it", "engine": "hf", "gpu": "l4", "context": 8192}),
        ("batch", {"model": "gpt2", "engine": "hf", "gpu": "b200", "context": 16}),
    ],
)
def test_search_evaluates_few_estimates(key: str, workload: dict[str, Any]) -> None:
    """Exponential growth then bisection: about 2 log2(limit) estimates, never a scan."""
    assert count_evaluations({"mode": "infer", **workload}, key) < 64


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 8, 255, 256, 1000])
@pytest.mark.parametrize("largest", [0, 1, 2, 5, 8, 100, 255, 256, 999, 1000, 5000])
def test_largest_finds_the_boundary_of_a_monotone_predicate(limit: int, largest: int) -> None:
    seen: list[int] = []

    def fits(value: int) -> Any:
        seen.append(value)
        assert 1 <= value <= limit, value
        return object() if value <= largest else None

    value, report = capacity._largest(fits, limit)  # type: ignore[arg-type]
    assert value == min(largest, limit)
    assert (report is None) == (value == 0)
    assert len(seen) <= 2 * limit.bit_length() + 2
