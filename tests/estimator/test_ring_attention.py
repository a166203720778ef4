"""Context parallel's ring attention backward (estimator/ring_attention.py), by hand from
torch.distributed.tensor.experimental._attention (``_templated_ring_attention_backward``,
all-gather rotation, fp32 accumulation), and its place in a layer's backward working set.

torchtitan's Table 6 (benchmarks/llama3_h100_202412_torchtitan.md: Llama 3.1 405B, TP 8, PP 8,
CP 1..8 at 32768 tokens per CP rank) rises from 75.3 to 84.9 GiB as CP grows with the tokens
per rank fixed: what a rank holds for the whole sequence grows with cp.
"""

from __future__ import annotations

import pytest

from vramlens.estimator import estimate
from vramlens.estimator.ring_attention import RingShape, ring_attention_backward_bytes
from vramlens.units import MiB


def test_ring_backward_bytes_by_hand() -> None:
    # 405B on one TP rank: 128 heads / 8 = 16, head 128, 32768 tokens per CP rank, bf16.
    shape = RingShape(tokens=32768, heads=16, head_dim=128, cp=8, compute_bytes=2)
    one = 32768 * 16 * 128  # elements of one rank's K (128 MiB in bf16)
    gathered = 8 * 2 * one * 2  # all-gathered cat([key, value]) of 8 ranks: 2 GiB
    accumulators = 3 * one * 4  # grad_query/key/value in fp32: 768 MiB
    rotated = 2 * (2 * one * 4)  # fp32 cat([grad_key, grad_value]) sent + the one received: 1 GiB
    assert ring_attention_backward_bytes(shape) == gathered + accumulators + rotated == 3840 * MiB


def test_no_ring_without_context_parallel() -> None:
    assert ring_attention_backward_bytes(RingShape(tokens=4096, heads=32, head_dim=128, cp=1, compute_bytes=2)) == 0


def test_shape_rejects_zero() -> None:
    with pytest.raises(ValueError, match=r"RingShape\.cp"):
        RingShape(tokens=1, heads=1, head_dim=1, cp=0, compute_bytes=2)


def test_the_layer_backward_holds_the_ring_at_cp_above_one() -> None:
    """Same tokens per rank (seq / cp = 8192), cp 1 and 4: with cp 4 a layer's backward working set
    is the ring's (all-gathered K/V and fp32 buffers), and the backward phase is higher by it."""
    base = {"model": "llama-3.1-8b", "framework": "torchtitan", "batch": 1, "recompute": "full", "loss": "chunked"}
    one = estimate({**base, "seq": 8192, "parallel": {"gpus": 8, "shard": "fsdp"}})
    four = estimate({**base, "seq": 32768, "parallel": {"gpus": 8, "shard": "fsdp", "cp": 4}})
    ring = ring_attention_backward_bytes(RingShape(tokens=8192, heads=32, head_dim=128, cp=4, compute_bytes=2))
    backward = {report.workload.parallel.cp: _phase(report, "backward") for report in (one, four)}
    working = [t for t in backward[4].terms if t.name == "a layer's backward working set"]
    assert working and working[0].bytes == ring
    assert backward[4].allocated_bytes > backward[1].allocated_bytes


def _phase(report, name: str):  # type: ignore[no-untyped-def]
    return next(phase for phase in report.phases if phase.name == name)
