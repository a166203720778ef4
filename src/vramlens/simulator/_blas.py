"""Where the backward's own cuBLAS workspace is allocated in a simulated training run.

PyTorch gives every (cuBLAS handle, CUDA stream) pair its own workspace from the caching
allocator, kept for the life of the process (``setWorkspaceForHandle`` /
``cublas_handle_stream_to_workspace`` in ``aten/src/ATen/cuda/CublasHandlePool.cpp``), and hands
out handles per thread (``getCurrentCUDABlasHandle``: a thread-local ``PoolWindow`` of a
``DeviceThreadHandlePool``). ``loss.backward()`` runs the CUDA part of the graph on the autograd
engine's device thread (``Engine::start_device_threads`` / ``thread_main`` in
``torch/csrc/autograd/engine.cpp``), which takes a handle of its own: the first cuBLAS call of the
first backward allocates a second workspace (the H200 battery's snapshots of 2026-11-27 hold two
32 MiB workspaces after every training run, one after inference). It is made right after the
output of that operator (``at::mm`` allocates its result, then asks for the handle), in the middle
of the step's address space: with expandable segments it splits the free range the logits leave,
and later vocabulary-sized requests map new pages instead.

A fake-tensor run makes no workspace; :class:`BackwardBlasWatch`, entered inside the tracker for
the whole run, notes the tracker's event count right after the first cuBLAS operator run by a
backward (an autograd graph task is running: ``torch._C._current_graph_task_id()``), where the
report's replay puts it (:mod:`vramlens.simulator.report`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["BLAS_OPERATORS", "BackwardBlasWatch"]

#: aten operators (overload packets, by name) whose CUDA kernels call cuBLAS / cuBLASLt through
#: ``at::cuda::blas`` (``aten/src/ATen/native/cuda/Blas.cpp``: ``addmm_out_cuda_impl`` serves mm,
#: addmm and ``_addmm_activation``; ``baddbmm_out_cuda_impl`` bmm and baddbmm; ``addmv`` / ``dot``;
#: ``_scaled_mm``). ``linear`` and ``matmul`` reach a dispatch mode already decomposed into these.
BLAS_OPERATORS = frozenset(
    {"mm", "addmm", "_addmm_activation", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "_scaled_mm"}
)


class BackwardBlasWatch(TorchDispatchMode):
    """A dispatch mode entered inside the tracker's: ``event`` becomes the tracker's event count right
    after the first cuBLAS operator a backward runs (-1: none yet), the index at which the autograd
    thread's workspace is allocated."""

    def __init__(self, tracker: Any) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.tracker = tracker
        self.event = -1

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.event < 0 and func.overloadpacket.__name__ in BLAS_OPERATORS and torch._C._current_graph_task_id() >= 0:
            self.event = self.tracker.event_count
        return out
