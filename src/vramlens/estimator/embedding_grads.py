"""The input embedding's gradient at the end of backward: when autograd makes it and what it holds
beside it (tied matrices get two contributions and their sum). Used by
:mod:`vramlens.estimator.step_phases`."""

from __future__ import annotations

from vramlens.estimator.stage_memory import StageMemory
from vramlens.resolve.context import TrainingContext
from vramlens.workload.options import Shard

__all__ = ["pending_embedding_grad_bytes", "tied_embedding_grad_bytes"]


def tied_embedding_grad_bytes(ctx: TrainingContext) -> int:
    """Bytes of one contribution to a tied embedding's gradient (vocab x hidden x grad bytes),
    when the tied matrix is trained in full on one unsharded rank; else 0.

    The matrix gets two gradient contributions (LM head first, embedding last). The
    autograd engine buffers the head's until the embedding's arrives and sums them into a
    new tensor (``InputBuffer::accumulate``), so at the embedding's backward both
    contributions and their sum are alive. Seen in simulated and tracked CPU runs of tied
    models (e.g. Llama-3.2-1B: three 1002 MiB fp32 tensors at once).
    """
    parallel = ctx.workload.parallel
    unsharded = parallel.shard in (Shard.NONE, Shard.DDP, Shard.ZERO1)
    if not (ctx.spec.tie_word_embeddings and ctx.full and unsharded and parallel.tp == 1 and parallel.pp == 1):
        return 0
    return ctx.spec.vocab_size * ctx.spec.hidden_size * ctx.grad_bytes


def pending_embedding_grad_bytes(ctx: TrainingContext, mem: StageMemory) -> int:
    """Bytes of the input embedding's gradient, which autograd makes only after the first
    layer's backward: absent from "last layer of backward" (an untied matrix trained in full on
    one unsharded rank without TP/PP; else 0). Seen in tracked CPU runs of checkpointed steps
    (tests/experiments: the peak is inside the first layer's backward, the embedding's 2 MiB
    gradient not yet there)."""
    parallel = ctx.workload.parallel
    unsharded = parallel.shard in (Shard.NONE, Shard.DDP, Shard.ZERO1)
    if ctx.spec.tie_word_embeddings or not (ctx.full and mem.stage.first and unsharded):
        return 0
    if parallel.tp != 1 or parallel.pp != 1:
        return 0
    return ctx.spec.vocab_size * ctx.spec.hidden_size * ctx.grad_bytes
