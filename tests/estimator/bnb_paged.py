"""bitsandbytes' paged optimizers on CPU with the paging their CUDA path does.

On a CPU parameter ``Optimizer8bit.get_state_buffer`` (bitsandbytes/optim/optimizer.py) falls back
to ``torch.zeros_like`` for every state buffer: nothing is paged. :func:`cuda_paging` runs its CUDA
branch instead (``if not self.is_paged or p.numel() < 1e5: torch.zeros_like(...)``, else
``F.get_paged``), with CUDA unified memory stood in for by numpy memory: like ``cudaMallocManaged``
it is outside torch's allocator, so the tracker (like ``max_memory_allocated``) must not see it: the
buffer is wrapped with the dispatch modes off (``F.get_paged`` wraps its pointer with
``torch.frombuffer``, which a dispatch mode would see as ``lift_fresh``). The optimizer's own CPU
kernels then update the buffers in place. Imported by tests only."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

#: The line of ``get_state_buffer``'s CUDA branch that :func:`cuda_paging` replays.
_RULE = "if not self.is_paged or p.numel() < 1e5:"


@contextlib.contextmanager
def cuda_paging() -> Iterator[list[Any]]:
    """Within the block, paged optimizers page as on CUDA; yields the list of paged buffers made."""
    import numpy as np
    import torch
    from bitsandbytes.optim import optimizer as module
    from torch.utils._python_dispatch import _disable_current_modes

    original = module.Optimizer8bit.get_state_buffer
    assert _RULE in inspect.getsource(original), "bitsandbytes changed get_state_buffer's paging rule"
    paged: list[Any] = []

    def get_state_buffer(self: Any, p: Any, dtype: Any = torch.float32) -> Any:
        if not self.is_paged or p.numel() < 1e5:
            return torch.zeros_like(p, dtype=dtype, device=p.device)
        with _disable_current_modes():
            buffer = torch.from_numpy(np.zeros(tuple(p.shape), dtype=torch.empty(0, dtype=dtype).numpy().dtype))
        paged.append(buffer)
        return buffer

    module.Optimizer8bit.get_state_buffer = get_state_buffer
    try:
        yield paged
    finally:
        module.Optimizer8bit.get_state_buffer = original
