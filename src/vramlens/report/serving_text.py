"""The words of an inference report's KV cache and of vLLM's two separate questions.

vLLM pre-allocates a KV pool from ``gpu_memory_utilization x capacity``, so "does it fit" is two
questions with different answers: **the engine starts** (weights, the profiled activation peak
and non-torch memory leave a pool that holds at least one sequence - vLLM refuses to start
otherwise) and **the batch fits the pool** (the workload's concurrent sequences at their length).
The GPU total is the budget either way; the headroom is the GPU's, never the pool's.
"""

from __future__ import annotations

from vramlens.result.report import MemoryReport, ServingCapacity
from vramlens.units import format_bytes

__all__ = ["serving_lines", "vllm_fit_sentence"]


def _vllm(report: MemoryReport) -> ServingCapacity | None:
    serving = report.serving
    if serving is None or serving.kv_pool_bytes is None or serving.budget_bytes is None:
        return None
    return serving


def vllm_fit_sentence(report: MemoryReport) -> tuple[str, bool] | None:
    """The fit line of a vLLM report with a GPU (the sentence and whether all of it holds), or None."""
    serving = _vllm(report)
    if serving is None or report.capacity_bytes is None:
        return None
    gpu = f"{report.gpu} ({format_bytes(report.capacity_bytes)})"
    total = f"GPU total {format_bytes(report.device_bytes)}"
    if report.device_bytes > report.capacity_bytes:
        return (
            f"does NOT fit {gpu}: {total}, over by {format_bytes(report.device_bytes - report.capacity_bytes)}",
            False,
        )
    if not serving.engine_starts:
        return f"vLLM does NOT start on {gpu}: no room for one sequence of {serving.tokens_per_sequence} tokens", False
    if not serving.fits:
        return f"vLLM starts on {gpu}, but the batch does NOT fit its KV pool; {total}", False
    return f"vLLM starts on {gpu} and the batch fits its KV pool; {total}", True


def serving_lines(report: MemoryReport) -> list[str]:
    """Plain-text lines about the KV cache: what the sequences need and, for vLLM, the engine's
    start, the batch in the pool and the pool itself."""
    serving = report.serving
    if serving is None:
        return []
    lines = [
        f"KV cache: {format_bytes(serving.kv_bytes_per_token)} per token; {serving.sequences} sequences x "
        f"{serving.tokens_per_sequence} tokens need {format_bytes(serving.kv_bytes_needed)}"
    ]
    vllm = _vllm(report)
    if vllm is None:
        return lines
    budget, pool = vllm.budget_bytes or 0, vllm.kv_pool_bytes or 0
    starts = "it starts" if vllm.engine_starts else "it does NOT start (the pool cannot hold one sequence)"
    fits = "the batch fits" if vllm.fits else "the batch does NOT fit"
    return [
        *lines,
        f"vLLM engine start: weights, activation peak and non-torch memory take {format_bytes(vllm.engine_bytes or 0)} "
        f"of its {format_bytes(budget)} budget (gpu_memory_utilization x capacity): {starts}",
        f"vLLM KV pool: {format_bytes(max(pool, 0))} = {vllm.kv_blocks} blocks of {format_bytes(vllm.kv_block_bytes or 0)}; "
        f"up to {vllm.max_concurrent_sequences} concurrent sequences of {vllm.tokens_per_sequence} tokens",
        f"vLLM batch in the pool: {vllm.sequences} sequences need {format_bytes(vllm.kv_bytes_needed)} of "
        f"{format_bytes(max(pool, 0))}: {fits}",
    ]
