"""The CUDA streams a training step allocates on, as the allocator model's stream ids.

PyTorch's caching allocator keeps the cached free blocks of each stream apart: a block belongs to
the stream that was current when it was allocated (``Block::stream``), ``free_block`` returns it to
that stream's free set, and ``get_free_block`` reuses only a block of the requesting stream
(``BlockComparatorSize`` orders by stream first; ``get_free_block`` fails when the best candidate's
``stream != p.stream()``; c10/cuda/CUDACachingAllocator.cpp, ``struct Block`` / ``BlockPool`` /
``get_free_block``). The model keys its pools by (stream, small) to the same effect
(:class:`vramlens.allocator._caching.CachingAllocatorModel`). So a collective's buffers, made on
its own stream, never reuse the compute stream's cached blocks and vice versa.

Which buffers are made on which stream (torch 2.13, ``torch/distributed/fsdp/_fully_shard``):

* FSDP2 all-gather: ``foreach_all_gather`` (``_fsdp_collectives.py``) allocates the flat
  ``all_gather_output`` (``world_size`` x the unit's shard, in ``param_dtype``) and, under a
  mixed-precision cast, the shard-sized ``flat_foreach_copy_input`` inside
  ``device_handle.stream(all_gather_copy_in_stream)``; ``FSDPCommContext.get_all_gather_streams``
  (``_fsdp_param_group.py``) picks that stream in forward and pre-backward. The unsharded
  parameters are made by ``foreach_all_gather_copy_out`` on the current (compute) stream.
* FSDP2 reduce-scatter: ``foreach_reduce`` makes ``reduce_scatter_input`` on the compute stream,
  then inside ``device_handle.stream(reduce_scatter_stream)`` the ``reduce_output`` (the shard, in
  ``reduce_dtype``) and, when that differs from the parameters' dtype, its cast
  (``_to_dtype_if_needed``): the sharded gradient that lives until ``zero_grad``. HSDP makes the
  cast on ``all_reduce_stream`` (``post_reduce_stream``).
* FSDP1 (``torch/distributed/fsdp/_runtime_utils.py``): ``_unshard`` all-gathers into the
  unsharded flat parameter inside ``state._unshard_stream``; ``_reduce_grad`` makes the sharded
  gradient inside ``state._post_backward_stream``. DeepSpeed ZeRO-3 likewise all-gathers on its
  own all-gather stream and reduces on its reduction stream.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Stream"]


class Stream(IntEnum):
    """Stream ids of allocation patterns and timelines (any distinct ints would do: the model only
    compares them)."""

    DEFAULT = 0
    """The compute stream (``torch.cuda.current_stream()`` of the training loop)."""
    ALL_GATHER = 1
    """FSDP2 ``all_gather_copy_in_stream``; FSDP1 ``_unshard_stream``; ZeRO-3's all-gather stream."""
    REDUCE_SCATTER = 2
    """FSDP2 ``reduce_scatter_stream``; FSDP1 ``_post_backward_stream``; ZeRO-3's reduction stream."""
    ALL_REDUCE = 3
    """FSDP2 ``all_reduce_stream`` (HSDP's replica all-reduce and its gradient cast)."""
    ALL_GATHER_COMM = 4
    """FSDP2 ``all_gather_stream`` (runs the collective; allocates nothing itself)."""
