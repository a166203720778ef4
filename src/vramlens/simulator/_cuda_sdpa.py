"""``F.scaled_dot_product_attention`` on the backend CUDA picks, where the CPU would pick another.

fp32 queries (autocast off) with grouped KV heads, ``enable_gqa`` and no mask reach no fused CUDA
kernel (flash and cuDNN take fp16/bf16, the memory-efficient kernel has no ``enable_gqa``), so
CUDA runs the math backend, ``aten._scaled_dot_product_attention_math``, which keeps the s x s
probabilities; the CPU's flash kernel would take the call and keep none
(:func:`vramlens.resolve.attention.sdpa_runs_math`; measured on an H200, QLoRA without autocast:
``validation/measured/2026-11-27-h200``).

With ``dropout_p > 0`` the math backend drops out the probabilities before ``matmul(attn, v)``
through ``at::dropout`` (``aten/src/ATen/native/transformers/attention.cpp``), which on CUDA is the
fused ``native_dropout``: a 1-byte mask and the dropped-out copy, both kept for backward beside the
softmax's output. On CPU ``at::dropout`` multiplies by a noise tensor in the scores' dtype instead
(``aten/src/ATen/native/Dropout.cpp``, ``is_fused_kernel_acceptable``), so such a call is run here as
the math backend without dropout (its probabilities), CUDA's ``native_dropout`` of them and the
product with the values repeated to every query head.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from vramlens._extras import require

__all__ = ["cuda_runs_math", "cuda_sdpa_backend"]


@contextlib.contextmanager
def cuda_sdpa_backend() -> Iterator[None]:
    """Run ``F.scaled_dot_product_attention`` calls that CUDA sends to the math backend on it (see
    the module doc); other calls run unchanged."""
    from unittest import mock

    torch = require("torch", purpose="vramlens simulate")
    functional = torch.nn.functional
    attention = functional.scaled_dot_product_attention

    def as_on_cuda(*args: Any, **kwargs: Any) -> Any:
        if not cuda_runs_math(torch, *args, **kwargs):
            return attention(*args, **kwargs)
        query, key, value = args
        return _math(torch, query, key, value, kwargs.get("dropout_p", 0.0), kwargs.get("is_causal", False),
                     kwargs.get("scale"))  # fmt: skip

    with mock.patch.object(functional, "scaled_dot_product_attention", as_on_cuda):
        yield


def cuda_runs_math(torch: Any, query: Any, key: Any, value: Any, *rest: Any, attn_mask: Any = None,
                   enable_gqa: bool = False, **kwargs: Any) -> bool:  # fmt: skip
    """Whether CUDA runs this SDPA call on the math backend (see the module doc)."""
    grouped = query.dim() == 4 and key.dim() == 4 and query.shape[-3] != key.shape[-3]
    fp32 = query.dtype == torch.float32 and not torch.is_autocast_enabled(query.device.type)  # autocast: bf16
    return bool(enable_gqa and attn_mask is None and not rest and grouped and fp32)


def _math(torch: Any, query: Any, key: Any, value: Any, dropout_p: float, is_causal: bool, scale: Any) -> Any:
    """The math backend's output as CUDA computes it (module doc: dropout through ``native_dropout``)."""
    math = torch.ops.aten._scaled_dot_product_attention_math
    output, probabilities = math(query, key, value, None, 0.0, is_causal, None, scale=scale, enable_gqa=True)
    if not 0 < dropout_p < 1:
        return output
    del output  # the product with the values is made again from the dropped-out probabilities
    dropped = torch.ops.aten.native_dropout(probabilities, dropout_p, True)[0]
    del probabilities
    repeated = value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3)
    return torch.matmul(dropped, repeated)
