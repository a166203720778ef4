"""fp32 grouped matmuls on fake tensors (simulate/_grouped_mm.py): CUDA runs them through a
per-group fallback, torch's meta function refuses them; inside ``any_dtype_grouped_mm`` fake
tensors run them with the memory a real run has."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from vramlens.simulator._grouped_mm import any_dtype_grouped_mm  # noqa: E402
from vramlens.trace.tracker import MemoryTracker  # noqa: E402

# 3 experts, 16 routed rows, hidden 32 -> inner 8 (multiples of 8: the bf16 path's alignment).
ROWS, HIDDEN, INNER, EXPERTS = 16, 32, 8, 3


def _step(trainable_weight: bool) -> tuple[int, int, list[int]]:
    """Forward and backward of one grouped linear in fp32 under a tracker: (peak, end, sizes
    of the storages live after the forward)."""
    x = torch.randn(ROWS, HIDDEN, requires_grad=True)
    weight = torch.randn(EXPERTS, INNER, HIDDEN, requires_grad=trainable_weight)
    offsets = torch.tensor([5, 11, 16], dtype=torch.int32)
    tracker = MemoryTracker(clock="event")
    tracker.register([x, weight, offsets])
    with tracker:
        out = torch.nn.functional.grouped_mm(x, weight.transpose(-2, -1), offs=offsets)
        live = sorted(size for size in (out.untyped_storage().nbytes(),))
        (out * 2).sum().backward()
    return tracker.peak, tracker.current, live


@pytest.mark.parametrize("trainable_weight", [False, True])
def test_fake_fp32_grouped_mm_has_the_real_runs_memory(trainable_weight: bool) -> None:
    """The real CPU kernel accepts fp32: a fake run inside the override tracks the same peak,
    end and output bytes (autograd saves only what the other operand's gradient needs)."""
    real = _step(trainable_weight)
    with any_dtype_grouped_mm(), FakeTensorMode():
        fake = _step(trainable_weight)
    assert fake == real
    assert real[2] == [ROWS * INNER * 4]  # the fp32 output: 16 x 8 x 4 bytes


def test_the_override_ends_with_the_block() -> None:
    """Outside the block torch's own meta function (bf16 only) is back."""
    with any_dtype_grouped_mm(), FakeTensorMode():
        x, weight = torch.randn(ROWS, HIDDEN), torch.randn(EXPERTS, INNER, HIDDEN)
        offsets = torch.tensor([5, 11, 16], dtype=torch.int32)
        assert torch.nn.functional.grouped_mm(x, weight.transpose(-2, -1), offs=offsets).dtype == torch.float32
    # Other shapes than above: fake tensors cache operator results by their inputs' metadata.
    with FakeTensorMode(), pytest.raises(RuntimeError, match="BF16"):
        x, weight = torch.randn(2 * ROWS, HIDDEN), torch.randn(EXPERTS, INNER, HIDDEN)
        offsets = torch.tensor([5, 11, 32], dtype=torch.int32)
        torch.nn.functional.grouped_mm(x, weight.transpose(-2, -1), offs=offsets)
