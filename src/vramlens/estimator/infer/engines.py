"""What each inference engine does with memory, as constants with their sources.

``hf`` is ``transformers`` ``generate()`` with its default ``DynamicCache``;
``vllm`` is the vLLM server (``vllm serve``) with its paged KV cache. Every
number here is a measurement or a default read from the engine, with where it
was published; ``docs/estimate.md`` discusses their error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from vramlens.units import GiB

__all__ = [
    "SAMPLER_TENSORS",
    "VLLM",
    "VllmConstants",
    "sampler_bytes_per_logit",
    "vllm_batched_tokens",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class VllmConstants:
    """vLLM's defaults and its memory outside the model's tensors."""

    max_num_batched_tokens: int
    """Tokens per engine step (the chunked-prefill budget, also the size of the profile run)
    when the workload leaves ``max_num_batched_tokens`` unset: 8192, the ``vllm serve``
    default on GPUs with at least 70 GiB other than the A100 (vllm/engine/arg_utils.py
    ``EngineArgs.get_batch_defaults``, usage context OPENAI_API_SERVER)."""
    small_gpu_batched_tokens: int
    """The same default on smaller GPUs and on the A100: 2048."""
    non_torch_bytes: int
    """Memory outside PyTorch's allocator on one GPU (CUDA context, loaded kernel modules,
    cuBLAS workspaces) that vLLM counts inside ``gpu_memory_utilization``: 1.79 GiB in the
    memory-profiling log of ``vllm serve meta-llama/Meta-Llama-3-8B`` on an H100
    (vllm-project/vllm PR #10511, comment of 2024-12-14, "non_torch_memory 1.79GiB")."""
    tp_comm_bytes: int
    """Added per rank when tp > 1 (NCCL communicators, custom all-reduce buffers): the
    same log at ``-tp 2`` shows non_torch_memory 3.58 GiB, 1.79 GiB above tp 1."""
    cuda_graph_bytes: int
    """CUDA graphs captured for decode batch sizes, counted inside the budget since vLLM
    0.21 (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1): logs report 0.21 GiB
    (Llama-3.2-1B, PR #11349), 0.26 GiB (PR #30515) and 0.36 GiB (gpustack/runner PR #251);
    the largest, 0.36 GiB, is used."""
    lm_head_vocab_padding: int
    """vLLM pads the vocabulary of its parallel embedding and LM head to a multiple of 64
    per rank (vllm/model_executor/layers/vocab_parallel_embedding.py, DEFAULT_VOCAB_PADDING_SIZE)."""


VLLM: Final = VllmConstants(
    max_num_batched_tokens=8192,
    small_gpu_batched_tokens=2048,
    non_torch_bytes=round(1.79 * GiB),
    tp_comm_bytes=round(1.79 * GiB),
    cuda_graph_bytes=round(0.36 * GiB),
    lm_head_vocab_padding=64,
)

#: Tensors alive at the high point of vLLM's sampler, per logit (one row per sequence, one column
#: per vocabulary entry). vLLM's profile run ends with a dummy sampler step over ``max_num_seqs``
#: rows with top-k and top-p enabled, so that the sort-based path is measured
#: (vllm/v1/worker/gpu_model_runner.py ``_dummy_sampler_run``; vllm/v1/sample/sampler.py and
#: ops/topk_topp_sampler.py ``apply_top_k_top_p``). ``None`` = the compute dtype.
SAMPLER_TENSORS: Final[tuple[tuple[str, int | None], ...]] = (
    ("LM head output", None),
    ("float32 logits", 4),
    ("sorted logits (top-k/top-p)", 4),
    ("sort indices (int64)", 8),
    ("softmax of the sorted logits", 4),
    ("cumulative sum (top-p)", 4),
    ("logits scattered back", 4),
    ("probabilities", 4),
    ("exponential noise of the sampling step", 4),
)


def sampler_bytes_per_logit(compute_bytes: int) -> int:
    """Bytes per (sequence, vocabulary entry) at the sampler's high point (:data:`SAMPLER_TENSORS`)."""
    return sum(compute_bytes if size is None else size for _, size in SAMPLER_TENSORS)


def vllm_batched_tokens(gpu_name: str | None, capacity_bytes: int | None) -> int:
    """vLLM's default ``max_num_batched_tokens`` for ``vllm serve`` on this GPU (no GPU: the large default)."""
    if capacity_bytes is None:
        return VLLM.max_num_batched_tokens
    large = capacity_bytes >= 70 * GiB and "a100" not in (gpu_name or "").lower()
    return VLLM.max_num_batched_tokens if large else VLLM.small_gpu_batched_tokens
