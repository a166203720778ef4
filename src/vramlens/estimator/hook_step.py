"""The optimizer step inside backward (``optimizer_in_backward``): which tensor's step sets the peak.

Each parameter is stepped in its post-accumulate-grad hook, so its gradient and the temporaries
of a one-tensor step (:func:`vramlens.estimator.optimizers.in_backward_step_bytes`) are alive
beside whatever backward still holds. The LM head's hook runs first in backward, beside every
layer's activations; a tied table's hook runs once both of its uses are accumulated, at the end of
backward. Checked against tracked CPU runs: tests/estimator/test_optimizer_in_backward.py.
"""

from __future__ import annotations

from vramlens.estimator.optimizers import OptimizerModel, in_backward_step_bytes
from vramlens.estimator.stage_memory import StageMemory
from vramlens.resolve.context import TrainingContext

__all__ = ["hook_step"]


def hook_step(ctx: TrainingContext, mem: StageMemory, optimizer: OptimizerModel, d_grad: int) -> None:
    """Set ``mem.hook_step_bytes`` (the largest tensor stepped beside the activations) and
    ``mem.hook_end_bytes`` (a tied table, at the end of backward). ``d_grad``: the gradient
    sharding degree (FSDP and ZeRO-2/3 step the rank's shard of each tensor). A group that records
    no largest tensor (LoRA adapters) counts as one tensor: an upper bound."""
    stage, tied = mem.stage, ctx.full and ctx.spec.tie_word_embeddings
    for group in stage.trainable:
        n = (stage.largest_linear if tied else group.largest_tensor or group.elements) // d_grad
        value = in_backward_step_bytes(optimizer, ctx.optimizer_impl, n, group.grad_bytes, group.state_bytes)
        if value > mem.hook_step_bytes:
            mem.hook_step_bytes = value
            temps = optimizer.temporaries_formula(ctx.optimizer_impl)
            mem.formulas["hook_step_bytes"] = f"{n:,} x {group.grad_bytes} B gradient + one-tensor step: {temps}"
        if tied and (stage.first or stage.last):
            table = group.largest_tensor // d_grad
            mem.hook_end_bytes = in_backward_step_bytes(
                optimizer, ctx.optimizer_impl, table, group.grad_bytes, group.state_bytes
            )
            mem.formulas["hook_end_bytes"] = f"tied table {table:,} x {group.grad_bytes} B gradient + its step"
