"""Context parallelism's ring attention: what its backward holds beyond a layer's own working set.

torch's context parallel (``torch.distributed.tensor.experimental._attention``, used by
torchtitan's ``context_parallel``) runs SDPA over the sequence shards of the ``cp`` ranks.
Its backward (``_templated_ring_attention_backward``), with the default options
(``rotate_method`` all-gather, the default of torchtitan's
``experimental.context_parallel_rotate_method``: config_manager.py at 9dec370 and since, and
``convert_to_f32=True``), keeps at once:

* the key and value of every CP rank: ``kv_rotater`` all-gathers ``cat([key, value])`` once
  (``_AllGatherRotater``): ``cp x 2 x`` one rank's K (or V) in the compute dtype;
* fp32 accumulators ``grad_query``, ``grad_key``, ``grad_value`` (``zeros_like(..., dtype=float32)``);
* the K/V gradients passed around the ring (``dkv_rotater``, all-to-all): the fp32
  ``cat([grad_key, grad_value])`` sent and the permuted copy received.

K and V have the query heads: torchtitan's Llama repeats the KV heads before SDPA
(``keys = repeat_kv(xk, self.n_rep)``, models/llama/model.py at 9dec370), so this counts
``num_heads`` for them (an upper bound for code that does not). Not counted: the per-step kernel outputs (bf16, the size the working set already has) and the
forward's merger (fp32 ``out`` and its ``_partial_update`` copies), which is smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.resolve.context import TrainingContext

__all__ = ["RingShape", "ring_attention_backward_bytes", "ring_backward_bytes"]

#: Bytes of the fp32 accumulators and rotated gradients (``convert_to_f32=True``).
_ACCUMULATOR_BYTES = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class RingShape:
    """One rank's attention inputs: tokens of its sequence shard, heads on this TP rank."""

    tokens: int
    heads: int
    head_dim: int
    cp: int
    compute_bytes: int

    def __post_init__(self) -> None:
        for name in ("tokens", "heads", "head_dim", "cp", "compute_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"RingShape.{name} must be at least 1")


def ring_attention_backward_bytes(shape: RingShape) -> int:
    """Bytes one rank's ring attention backward holds beside the layer (0 without context parallel).

    ``cp x 2 x T x H x d x compute_bytes`` (all-gathered K and V) ``+ 3 x T x H x d x 4`` (fp32
    gradient accumulators of Q, K, V) ``+ 2 x 2 x T x H x d x 4`` (the fp32 K/V gradient sent
    around the ring and the one received); T tokens of this rank's shard, H heads per TP rank,
    d the head size.
    """
    if shape.cp == 1:
        return 0
    one = shape.tokens * shape.heads * shape.head_dim
    gathered = shape.cp * 2 * one * shape.compute_bytes
    accumulators = 3 * one * _ACCUMULATOR_BYTES
    rotated = 2 * 2 * one * _ACCUMULATOR_BYTES
    return gathered + accumulators + rotated


def ring_backward_bytes(ctx: TrainingContext) -> int:
    """:func:`ring_attention_backward_bytes` of one rank of the workload: ``ctx.tokens`` (batch x
    seq / cp), the query heads on this TP rank; 0 without context parallel or attention."""
    parallel, spec = ctx.workload.parallel, ctx.spec
    if parallel.cp == 1 or spec.attention is None:
        return 0
    heads = max(spec.num_heads // parallel.tp, 1)
    shape = RingShape(
        tokens=ctx.tokens, heads=heads, head_dim=spec.head_dim, cp=parallel.cp, compute_bytes=ctx.compute_bytes
    )
    return ring_attention_backward_bytes(shape)
