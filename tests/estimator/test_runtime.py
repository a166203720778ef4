"""The device level from its parts (``vramlens.estimator.runtime``), by hand.

What is checked, and where the expected numbers come from:

* each constant is the value its source gives: CUDA context 758 MiB (lazy module loading, measured
  on an H200 after a training step, validation/measured/2026-11-27-h200), 1000 MiB eager; NCCL 544 MiB for a 2-rank communicator and 688 MiB for a larger one
  (NVIDIA/nccl#964), 3.28 GB (= 3359 MiB) for all-to-all (NVIDIA/nccl#1685); the cuBLAS workspace
  32 MiB (``:4096:8``); 1 MiB = 2**20 B;
* one communicator per parallel group with more than one rank, one 2-rank group per pipeline
  neighbour;
* device = reserved + CUDA context + NCCL + paged optimizer state (CUDA unified memory, seen by
  nvidia-smi but not by the allocator);
* the cuBLAS workspace comes from PyTorch's caching allocator, so it is in every phase's
  allocated bytes.
"""

from __future__ import annotations

import pytest

from vramlens.categories import Category
from vramlens.estimator import estimate
from vramlens.estimator.runtime import (
    CUBLAS_WORKSPACE_BYTES,
    CUDA_CONTEXT_BYTES,
    CUDA_CONTEXT_EAGER_BYTES,
    NCCL_ALL_TO_ALL_BYTES,
    NCCL_PAIR_BYTES,
    NCCL_RING_BYTES,
    RUNTIME_CONSTANTS,
    communicators,
    runtime_parts,
)
from vramlens.model.resolve import load_model
from vramlens.result.report import MemoryReport
from vramlens.workload.options import Shard
from vramlens.workload.spec import Parallelism

_MIB = 1024 * 1024


def test_constants_are_the_documented_values() -> None:
    assert CUDA_CONTEXT_BYTES == 758 * _MIB == 794_820_608
    assert CUDA_CONTEXT_EAGER_BYTES == 1000 * _MIB
    assert NCCL_PAIR_BYTES == 544 * _MIB
    assert NCCL_RING_BYTES == 688 * _MIB
    assert NCCL_ALL_TO_ALL_BYTES == 3359 * _MIB  # round(3.28 x 1024) MiB
    assert CUBLAS_WORKSPACE_BYTES == 4096 * 1024 * 8 == 33_554_432


def test_every_constant_names_its_source() -> None:
    for constant in RUNTIME_CONSTANTS.values():
        assert constant.bytes > 0
        assert any(mark in constant.source for mark in ("#", ".cpp")), constant.name


def test_one_gpu_has_no_communicator() -> None:
    assert communicators(Parallelism()) == []
    assert runtime_parts(Parallelism()) == {"cuda_context": 758 * _MIB}


@pytest.mark.parametrize(
    ("parallel", "expected"),
    [
        (Parallelism(gpus=2, shard=Shard.DDP), [("data", 2, 544 * _MIB)]),
        (Parallelism(gpus=8, shard=Shard.FSDP), [("data", 8, 688 * _MIB)]),
        (Parallelism(gpus=8, shard=Shard.FSDP, tp=2), [("data", 4, 688 * _MIB), ("tensor", 2, 544 * _MIB)]),
        (
            Parallelism(gpus=16, shard=Shard.HSDP, shard_degree=8),
            [("shard", 8, 688 * _MIB), ("replicate", 2, 544 * _MIB)],
        ),
        (
            Parallelism(gpus=8, shard=Shard.FSDP, pp=4),
            [("data", 2, 544 * _MIB), ("pipeline 1", 2, 544 * _MIB), ("pipeline 2", 2, 544 * _MIB)],
        ),
        (Parallelism(gpus=8, shard=Shard.FSDP, ep=8), [("data", 8, 688 * _MIB), ("expert", 8, 3359 * _MIB)]),
    ],
)
def test_communicators_per_group(parallel: Parallelism, expected: list[tuple[str, int, int]]) -> None:
    assert communicators(parallel) == expected
    assert runtime_parts(parallel)["nccl"] == sum(nbytes for _, _, nbytes in expected)


def test_paged_bytes_and_eager_modules() -> None:
    parts = runtime_parts(Parallelism(), paged_bytes=123_456_789, eager_modules=True)
    assert parts == {"cuda_context": 1000 * _MIB, "paged_optimizer_state": 123_456_789}


# ---- through estimate(): a small model ---------------------------------------------------------


def _report(**overrides: object) -> MemoryReport:
    workload: dict[str, object] = {"model": "llama-3.2-1b", "framework": "hf", "batch": 1, "seq": 256}
    return estimate({**workload, **overrides})


def test_levels_on_one_gpu() -> None:
    report = _report()
    assert report.device_bytes - report.reserved_bytes == 758 * _MIB
    assert report.device_bytes > report.reserved_bytes > report.allocated_bytes
    assert dict(report.runtime) == {"cuda_context": 758 * _MIB}


def test_levels_on_eight_gpus() -> None:
    report = _report(parallel={"gpus": 8, "shard": "ddp"})
    assert report.device_bytes - report.reserved_bytes == (758 + 688) * _MIB
    assert dict(report.runtime) == {"cuda_context": 758 * _MIB, "nccl": 688 * _MIB}


def test_cublas_workspaces_are_allocated_in_every_phase() -> None:
    """The main thread's and the autograd thread's (``simulator/_blas.py``), 32 MiB each on Hopper."""
    for phase in _report().phases:
        assert phase.breakdown[Category.OTHER] == 2 * 32 * _MIB


def test_paged_optimizer_state_is_above_reserved() -> None:
    # paged-adamw, fp32 parameters: two fp32 moments per element; bitsandbytes pages the buffers of
    # tensors of at least 1e5 elements (estimator/paged.py): all but the 33 norms of 2048 elements.
    n, norms = load_model("llama-3.2-1b").num_parameters, 33 * 2048
    paged = _report(precision="fp32", optimizer="paged-adamw")
    assert paged.device_bytes - paged.reserved_bytes == 758 * _MIB + 8 * (n - norms)
    assert paged.runtime["paged_optimizer_state"] == 8 * (n - norms) == 9_885_974_528
    # The norms' state stays in the allocator; every phase, so the allocated peak, drops by the rest.
    kept = [term.bytes for term in paged.terms if term.category is Category.OPTIMIZER_STATE]
    assert kept == [8 * norms]
    plain = _report(precision="fp32", optimizer="adamw", optimizer_impl="fused")
    assert plain.allocated_bytes - paged.allocated_bytes == 8 * (n - norms)
