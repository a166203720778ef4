"""The device level from its parts: memory a process holds outside PyTorch's caching allocator.

``device`` (what nvidia-smi shows) = ``reserved`` + the parts below. Each constant is in
:data:`RUNTIME_CONSTANTS` with its source; "measured" ones say where and when. MB in a source is
taken as the MiB the tools print (``torch.cuda.mem_get_info`` / 2**20, nvidia-smi MiB).

* **CUDA context** (driver state, the per-SM local-memory reservation and the kernel modules
  loaded so far). With lazy module loading (``CUDA_MODULE_LOADING=LAZY``, which PyTorch sets by
  default since 1.13, pytorch/pytorch#86509, on CUDA >= 11.7) a bare context measured 287 MB
  (PR #86509, 2022), about 400 MB (pytorch/pytorch#109888, 2023) and 426 MiB on an RTX 6000 Ada
  with torch 2.10 + CUDA 13.0 (unslothai/unsloth-zoo#1053, 2026); a step then loads the kernels it
  uses. **Measured** on an H200 (driver 580.159.04, torch 2.11 + CUDA 13.0, 2026-11-27,
  ``validation/measured/2026-11-27-h200``): 518 MiB bare, 774 MiB after one bf16 matmul (98 MiB of
  it reserved), and nvidia-smi minus ``max_memory_reserved`` = 758 MiB after every training step of
  the battery (708-742 MiB after HF ``generate`` and QLoRA): 758 MiB, a context with a training
  step's kernels. Older drivers and smaller GPUs (fewer SMs) measured less, so elsewhere this is
  high by up to ~300 MiB.
  With eager loading (torch < 1.13 or ``CUDA_MODULE_LOADING=EAGER``): "> 1000 MB" (ptrblck,
  pytorch/pytorch#107667, 2023): 1000 MiB.
* **NCCL**, per communicator this rank takes part in (buffers of ``NCCL_BUFFSIZE`` = 4 MiB per
  channel and peer, channels chosen for the link's bandwidth; memory is linear in channels and a
  ring has two connections, sjeaugey in NVIDIA/nccl#864/#986): measured after an all-reduce on
  4 x A100 with NVLink, 544 MB for a 2-rank group and 688 MB for larger ones (NVIDIA/nccl#964,
  2023). All-to-all (expert parallelism) connects every pair on up to 32 channels: 3.28 GB more
  after the first ``all_to_all_single`` on 8 x H100 (NVIDIA/nccl#1685, 2025). Communicators: the
  sharded/data-parallel group, the tensor-, context- and expert-parallel groups, and one 2-rank
  group per pipeline neighbour; a group of one rank makes none.
* **cuBLAS workspaces** come from the caching allocator (``getNewWorkspace`` in
  ``aten/src/ATen/cuda/CublasHandlePool.cpp``: ``:4096:8`` = 32 MiB on sm90, ``:4096:2:16:8`` =
  8.125 MiB elsewhere, per handle and stream; cuBLASLt shares it by default), so they are in
  ``allocated``: :data:`CUBLAS_WORKSPACE_BYTES` (the Hopper size) is counted once there.
* **paged optimizer state** (bitsandbytes paged optimizers): CUDA unified memory, seen by
  nvidia-smi while resident, never by the allocator.

vLLM's non-torch memory and CUDA graphs are engine constants
(:mod:`vramlens.estimator.infer.engines`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from vramlens.categories import Category
from vramlens.result.report import Term
from vramlens.units import MiB
from vramlens.workload.options import Shard
from vramlens.workload.spec import Parallelism

__all__ = [
    "CUBLAS_FORMULA",
    "CUBLAS_WORKSPACE_BYTES",
    "CUDA_CONTEXT_BYTES",
    "CUDA_CONTEXT_EAGER_BYTES",
    "NCCL_ALL_TO_ALL_BYTES",
    "NCCL_PAIR_BYTES",
    "NCCL_RING_BYTES",
    "RUNTIME_CONSTANTS",
    "RuntimeConstant",
    "TRAINING_CUBLAS_BYTES",
    "communicators",
    "runtime_parts",
    "runtime_terms",
]

#: When the memory outside the allocator is alive.
WHOLE_RUN = "the whole run (outside the allocator)"
#: Where the communicators' sizes come from.
NCCL_SOURCES = "measured after an all-reduce (NVIDIA/nccl#964) and an all-to-all (NVIDIA/nccl#1685)"


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeConstant:
    """One constant of the device level: bytes and where the number comes from."""

    name: str
    bytes: int
    source: str


def _constant(name: str, nbytes: int, source: str) -> RuntimeConstant:
    return RuntimeConstant(name=name, bytes=nbytes, source=source)


RUNTIME_CONSTANTS: Final = {
    c.name: c
    for c in (
        _constant(
            "cuda_context",
            758 * MiB,
            "measured: nvidia-smi - max_memory_reserved after HF training steps, H200, driver 580.159.04, torch "
            "2.11+cu130, 2026-11-27 (validation/measured/2026-11-27-h200; 518 MiB bare); lazy module loading's "
            "bare context elsewhere: 287 MB (pytorch/pytorch#86509, 2022), ~400 MB (#109888, 2023), 426 MiB "
            "RTX 6000 Ada torch 2.10+cu130 (unslothai/unsloth-zoo#1053, 2026)",
        ),
        _constant(
            "cuda_context_eager",
            1000 * MiB,
            "eager module loading (torch < 1.13, CUDA < 11.7 or CUDA_MODULE_LOADING=EAGER): '>1000MB' "
            "(ptrblck, pytorch/pytorch#107667, 2023)",
        ),
        _constant(
            "nccl_pair",
            544 * MiB,
            "measured: NCCL communicator of 2 ranks after an all-reduce, 4 x A100 NVLink (NVIDIA/nccl#964, 2023)",
        ),
        _constant(
            "nccl_ring",
            688 * MiB,
            "measured: NCCL communicator of > 2 ranks after an all-reduce, 4 x A100 NVLink (NVIDIA/nccl#964, 2023)",
        ),
        _constant(
            "nccl_all_to_all",
            round(3.28 * 1024) * MiB,
            "measured: +3.28 GB after the first all_to_all_single on 8 x H100, 32 channels per pair "
            "(NVIDIA/nccl#1685, 2025)",
        ),
        _constant(
            "cublas_workspace",
            32 * MiB,
            "aten/src/ATen/cuda/CublasHandlePool.cpp: CUBLAS_WORKSPACE_CONFIG default :4096:8 on sm90 "
            "(:4096:2:16:8 = 8.125 MiB elsewhere), from the caching allocator (counted in allocated)",
        ),
    )
}
CUDA_CONTEXT_BYTES: Final = RUNTIME_CONSTANTS["cuda_context"].bytes
CUDA_CONTEXT_EAGER_BYTES: Final = RUNTIME_CONSTANTS["cuda_context_eager"].bytes
NCCL_PAIR_BYTES: Final = RUNTIME_CONSTANTS["nccl_pair"].bytes
NCCL_RING_BYTES: Final = RUNTIME_CONSTANTS["nccl_ring"].bytes
NCCL_ALL_TO_ALL_BYTES: Final = RUNTIME_CONSTANTS["nccl_all_to_all"].bytes
CUBLAS_WORKSPACE_BYTES: Final = RUNTIME_CONSTANTS["cublas_workspace"].bytes
#: cuBLAS workspace bytes a training step holds: the main thread's and, from the first backward's
#: first matmul on, the autograd engine's device thread's (its own handle; one workspace per handle
#: and stream: CublasHandlePool.cpp; two 32 MiB blocks in every training snapshot of the H200 battery).
TRAINING_CUBLAS_BYTES: Final = 2 * CUBLAS_WORKSPACE_BYTES
#: The cuBLAS workspace's term formula.
CUBLAS_FORMULA: Final = "32 MiB: CUBLAS_WORKSPACE_CONFIG :4096:8 on sm90, one handle and stream (CublasHandlePool.cpp)"


def communicators(parallel: Parallelism) -> list[tuple[str, int, int]]:
    """(group, ranks, bytes) of each NCCL communicator one rank of the busiest stage joins.

    Data parallelism: one group of the data- and context-parallel ranks, which hold the same
    parameters (HSDP: the shard group and the replica group);
    tensor, context and expert parallelism: a group each; pipeline: one 2-rank group per
    neighbouring stage (a middle stage has two). A rank alone in a group makes no communicator.
    """
    found: list[tuple[str, int, int]] = []

    def add(group: str, ranks: int, nbytes: int | None = None) -> None:
        if ranks > 1:
            found.append((group, ranks, nbytes if nbytes is not None else _ring(ranks)))

    dp = parallel.dp
    if parallel.shard is Shard.HSDP and parallel.shard_degree is not None:
        add("shard", parallel.shard_degree)
        add("replicate", dp // parallel.shard_degree)
    elif parallel.shard is not Shard.NONE:
        add("data", dp * parallel.cp)
    add("tensor", parallel.tp)
    add("context", parallel.cp)
    add("expert", parallel.ep, NCCL_ALL_TO_ALL_BYTES)
    for neighbour in range(min(parallel.pp - 1, 2)):
        add(f"pipeline {neighbour + 1}", 2)
    return found


def _ring(ranks: int) -> int:
    return NCCL_PAIR_BYTES if ranks == 2 else NCCL_RING_BYTES


def runtime_parts(parallel: Parallelism, *, paged_bytes: int = 0, eager_modules: bool = False) -> dict[str, int]:
    """Memory outside the caching allocator, by part: the CUDA context, NCCL communicators and
    paged optimizer state (bytes). ``eager_modules``: kernels loaded eagerly (torch < 1.13)."""
    runtime = {"cuda_context": CUDA_CONTEXT_EAGER_BYTES if eager_modules else CUDA_CONTEXT_BYTES}
    nccl = sum(nbytes for _, _, nbytes in communicators(parallel))
    if nccl:
        runtime["nccl"] = nccl
    if paged_bytes:
        runtime["paged_optimizer_state"] = paged_bytes
    return runtime


#: What each runtime part is, for its term: (name, formula); vLLM's parts are its engine constants
#: (:mod:`vramlens.estimator.infer.engines`).
_PART_TERMS: Final = {
    "cuda_context": (
        "CUDA context",
        "758 MiB: a lazily loaded context with a training step's kernels (measured: H200, CUDA 13)",
    ),
    "cuda_context_eager": (
        "CUDA context (eager module loading)",
        "1000 MiB: every kernel module loaded at start (pytorch/pytorch#107667)",
    ),
    "paged_optimizer_state": (
        "paged optimizer state (CUDA unified memory, resident)",
        "optimizer state x elements of the paged groups / state shards (bitsandbytes paged optimizer)",
    ),
    "cuda_context_and_kernels": (
        "vLLM non-torch memory (CUDA context, kernels, cuBLAS workspaces)",
        "non_torch_memory 1.79 GiB in vllm serve's memory-profiling log, Llama-3-8B on an H100 (vllm PR #10511)",
    ),
    "cuda_graphs": (
        "vLLM CUDA graphs (decode batch sizes)",
        "0.36 GiB, the largest of the logs of vllm PR #11349, PR #30515 and gpustack/runner PR #251",
    ),
    "nccl_and_custom_allreduce": (
        "vLLM NCCL communicators and custom all-reduce buffers",
        "non_torch_memory 3.58 GiB at -tp 2, 1.79 GiB above tp 1 (vllm PR #10511)",
    ),
}


def runtime_terms(runtime: dict[str, int], parallel: Parallelism, *, eager_modules: bool = False) -> tuple[Term, ...]:
    """The device level's terms above ``reserved``: one per part of ``runtime`` (:func:`runtime_parts`,
    or vLLM's), with its source; NCCL lists the communicators of :func:`communicators`."""
    terms = []
    for part, nbytes in runtime.items():
        if part == "nccl":
            groups = ", ".join(
                f"{group} ({ranks} ranks) {nbytes // MiB} MiB" for group, ranks, nbytes in communicators(parallel)
            )
            name, formula = "NCCL communicators", f"{groups}: {NCCL_SOURCES}"
        else:
            key = "cuda_context_eager" if part == "cuda_context" and eager_modules else part
            name, formula = _PART_TERMS[key]
        terms.append(Term(name=name, category=Category.RUNTIME, bytes=nbytes, explain=formula, alive=WHOLE_RUN))
    return tuple(term for term in terms if term.bytes)
