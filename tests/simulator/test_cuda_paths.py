"""``simulator.build.cuda_code_paths``: the simulated SDPA call keeps what CUDA's backend keeps.

CUDA has no fused SDPA kernel for fp32 queries with grouped KV heads (flash and cuDNN: fp16/bf16;
memory-efficient: no ``enable_gqa``), so it runs the math backend and keeps the ``heads x s x s``
probabilities; the CPU's flash kernel takes the call and keeps none. Measured on an H200: QLoRA
without autocast (``validation/measured/2026-11-27-h200``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _saved_shapes(dtype: object, kv_heads: int, **kwargs: object) -> list[tuple[int, ...]]:
    from vramlens.simulator.build import cuda_code_paths

    q = torch.randn(1, 4, 64, 16, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(1, kv_heads, 64, 16, dtype=dtype, requires_grad=True) for _ in range(2))
    shapes: list[tuple[int, ...]] = []

    def pack(tensor: object) -> object:
        shapes.append(tuple(tensor.shape))  # type: ignore[attr-defined]
        return tensor

    with cuda_code_paths(), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, **kwargs)
    assert out.shape == (1, 4, 64, 16)
    return shapes


def test_fp32_grouped_heads_keep_the_probabilities() -> None:
    assert (1, 4, 64, 64) in _saved_shapes(torch.float32, 2, enable_gqa=True)


def test_dropout_on_the_math_backend_keeps_a_mask_and_the_dropped_out_copy() -> None:
    """CUDA's math backend drops out the probabilities through ``native_dropout``: the 1-byte mask
    and the dropped-out fp32 copy are kept beside the softmax's output (simulator/_cuda_sdpa.py)."""

    def scores(**kwargs: object) -> list[tuple[int, ...]]:
        return [shape for shape in _saved_shapes(torch.float32, 2, enable_gqa=True, **kwargs) if shape[-2:] == (64, 64)]

    # Two more s x s tensors than without dropout: the mask and the dropped-out copy.
    assert len(scores(dropout_p=0.1)) == len(scores()) + 2


def test_under_autocast_the_fp32_queries_reach_a_fused_kernel_in_bf16() -> None:
    """Mixed precision: rotary embeddings in the fp32 residual's dtype make the queries fp32, and
    autocast casts them to bf16 inside the SDPA call (a fused kernel on CUDA)."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        shapes = _saved_shapes(torch.float32, 2, enable_gqa=True)
    assert all(shape[-2:] != (64, 64) for shape in shapes)


@pytest.mark.parametrize(
    ("dtype", "kv_heads", "kwargs"),
    [(torch.bfloat16, 2, {"enable_gqa": True}), (torch.float32, 4, {"enable_gqa": True}), (torch.float32, 4, {})],
    ids=["bf16", "no-gqa", "no-enable-gqa"],
)
def test_otherwise_no_probabilities_are_kept(dtype: object, kv_heads: int, kwargs: dict) -> None:
    assert all(shape[-2:] != (64, 64) for shape in _saved_shapes(dtype, kv_heads, **kwargs))
