"""FSDP2's unshard of one unit as allocator requests, for :mod:`vramlens.estimator.step_pattern`.

Source: ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`` (``FSDPParamGroup.unshard``,
``wait_for_unshard``, ``comm_ctx.all_gather_state``). Keys are the pattern's allocation keys.
"""

from __future__ import annotations

from vramlens.allocator.pattern import Pattern
from vramlens.allocator.streams import Stream

__all__ = ["prefetched", "unshard"]


def unshard(p: Pattern, held: int, output: int, tensors: tuple[int, ...]) -> tuple[list[int], int]:
    """FSDP2's unshard of one unit in forward (``FSDPParamGroup.unshard`` / ``wait_for_unshard``):
    the all-gather output (``output`` bytes) on the all-gather stream, the parameters (``tensors``
    bytes) copied out of it on the compute stream, then the previous unit's output ``held`` freed
    (``comm_ctx.all_gather_state``). Returns the parameters' keys and this unit's output, held
    until the next unit's copy-out (or the root's post-forward)."""
    made = p.alloc(output, Stream.ALL_GATHER)
    params = [p.alloc(t) for t in tensors]
    p.free(held)
    return params, made


def prefetched(p: Pattern, held: int, tensors: tuple[int, ...]) -> list[int]:
    """FSDP2's backward unshard of a unit prefetched by the previous one: the parameters
    (``tensors`` bytes) copied out, then the all-gather output ``held`` freed at once
    (``wait_for_unshard`` outside forward). Returns the parameters' keys."""
    params = [p.alloc(t) for t in tensors]
    p.free(held)
    return params
