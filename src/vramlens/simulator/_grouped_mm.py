"""Grouped matmuls in any float dtype on fake tensors, as CUDA runs them.

``aten::_grouped_mm`` (``torch.nn.functional.grouped_mm``; transformers' fused MoE experts
call it) takes bf16 inputs on its CUTLASS fast path and any other float dtype on a fallback
that loops ``mm`` over the groups into one output tensor (``_grouped_mm_fallback`` in
``aten/src/ATen/native/cuda/GroupedBlas.cpp``, torch >= 2.9). The meta function that fake
tensors run (``meta_grouped_mm`` in ``torch/_meta_registrations.py``) repeats only the fast
path's checks and refuses fp32, so an fp32 expert (QLoRA's k-bit preparation casts the
unquantized 3-D experts to fp32) stops a simulation that a GPU would run.

While :func:`any_dtype_grouped_mm` is active, the Meta kernel of ``aten::_grouped_mm`` keeps
torch's own meta function for bf16 and, for other dtypes, returns the output torch's
``_create_grouped_mm_output_tensor`` makes (the helper the real kernel's output follows).
Autograd is untouched: torch's generated backward still decides what it saves (only the
operand the other gradient needs), so the memory is a real run's.

The kernel is registered once per process and stays: removing a Meta kernel does not reach
fake tensors that already dispatched to it (torch's Python dispatcher keeps resolved
kernels), so instead the kernel itself defers to torch's meta function whenever no
``any_dtype_grouped_mm`` block is active.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from vramlens._extras import require

__all__ = ["any_dtype_grouped_mm"]


#: Open ``any_dtype_grouped_mm`` blocks, and whether the kernel is registered (its Library).
_STATE: dict[str, Any] = {"depth": 0, "library": None}


@contextlib.contextmanager
def any_dtype_grouped_mm() -> Iterator[None]:
    """Let fake tensors run ``aten::_grouped_mm`` in every float dtype CUDA accepts (see the
    module docstring); outside the block torch's checks apply again. A torch without the
    operator or its meta helpers is left as it is."""
    if _STATE["library"] is None and not _register():
        yield
        return
    _STATE["depth"] += 1
    try:
        yield
    finally:
        _STATE["depth"] -= 1


def _register() -> bool:
    """Register the dtype-relaxed Meta kernel (once); False when this torch lacks the pieces."""
    torch = require("torch", purpose="vramlens simulate")
    registrations = torch._meta_registrations
    original = getattr(registrations, "meta_grouped_mm", None)
    output = getattr(registrations, "_create_grouped_mm_output_tensor", None)
    if original is None or output is None or not hasattr(torch.ops.aten, "_grouped_mm"):
        return False

    def meta(mat_a: Any, mat_b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Any:
        if not _STATE["depth"] or mat_a.dtype == mat_b.dtype == torch.bfloat16:
            return original(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)
        torch._check(mat_a.dtype == mat_b.dtype, lambda: f"grouped_mm: {mat_a.dtype} and {mat_b.dtype} differ")
        return output(mat_a, mat_b, offs, out_dtype)

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel ..."
        library.impl("_grouped_mm", meta, "Meta")
    _STATE["library"] = library  # kept alive: the registration lasts as long as the Library
    return True
