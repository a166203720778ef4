"""Optimizer state and step temporaries, per optimizer and implementation (a registry).

State sizes (bytes per trainable element):

* ``adamw``: two moments in the parameter dtype (torch.optim.AdamW creates them
  with ``zeros_like(param)``).
* ``adamw-8bit`` / ``paged-adamw-8bit`` (bitsandbytes): two 8-bit moments plus one
  fp32 absmax per 256-element block each: ``2 * (1 + 4/256)``; where the layout knows each
  tensor's size the state is counted per tensor instead (:mod:`vramlens.estimator.paged`: fp32
  moments under bnb's ``min_8bit_size`` = 4096 elements, Trainer's 32-bit embeddings).
* ``paged-*``: the same bytes; the buffers of tensors of at least 1e5 elements are allocated in
  CUDA unified memory outside PyTorch's allocator: visible to nvidia-smi (device level) but not
  to max_memory_allocated; smaller ones stay in the allocator (:mod:`vramlens.estimator.paged`).
* ``adafactor`` (transformers, beta1=None): factored second moment, ``rows + cols``
  per matrix, ~0 bytes per element for large matrices; counted as 0, with step
  temporaries in fp32 of the largest tensor: the squared gradient and the update
  (2 copies), plus the fp32 up-casts of the gradient and the parameter when they are
  16-bit (4 copies in all). Read from ``Adafactor.step`` (``grad.float()``,
  ``p.float()``, ``grad**2 + eps``, ``_approx_sq_grad``, ``p_data_fp32.add_(-update)``)
  and measured on CPU with ``StorageTracker`` (transformers 5.23: 4.0 fp32 copies of a
  bf16 1024 x 4096 matrix, 2.0 of an fp32 one; tests/estimator/test_optimizer_in_backward.py).
* ``sgd``: one momentum buffer (momentum > 0 assumed); ``lion``: one moment.

Step temporaries (bytes, on top of the state):

* ``foreach`` AdamW: ``torch._foreach_sqrt(exp_avg_sqs)`` materializes one
  state-sized copy of every moment of the group at once: ``elements * state_bytes``.
* ``per-tensor``: ``sqrt`` and the division each make a copy of one tensor at a time:
  2 x the largest tensor (0 for optimizers that update in place, ``temp_copies = 0``).
* ``fused``: updates in place: 0.

Sources: torch/optim/adamw.py and _multi_tensor_adamw / _single_tensor_adamw
(torch 2.13); bitsandbytes optim/optimizer.py (block size 256, min_8bit_size
4096); transformers optimization.py Adafactor.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.workload.options import OptimizerImpl, OptimizerName

__all__ = ["OPTIMIZERS", "OptimizerModel", "in_backward_step_bytes", "optimizer_model"]


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimizerModel:
    """Memory behaviour of one optimizer."""

    name: OptimizerName
    moments: int
    """State tensors per parameter kept in the parameter dtype (0 when fixed_state_bytes is used)."""
    fixed_state_bytes: float = 0.0
    """Bytes per element of state independent of the parameter dtype (8-bit optimizers)."""
    paged: bool = False
    """State lives in unified memory outside PyTorch's allocator."""
    temp_copies: int = 1
    """State-sized temporaries a multi-tensor step creates per moment group."""
    fp32_step_copies: int = 0
    """fp32 copies of the largest tensor a per-tensor step makes whatever the parameter dtype."""
    upcast_copies: int = 0
    """More fp32 copies of the largest tensor when the parameters are 16-bit (Adafactor up-casts
    the gradient and the parameter)."""
    impls: tuple[OptimizerImpl, ...] = (OptimizerImpl.PER_TENSOR, OptimizerImpl.FOREACH, OptimizerImpl.FUSED)

    def state_bytes(self, elements: int, param_state_bytes: int) -> float:
        """Bytes of optimizer state for ``elements`` trainable elements."""
        if self.fixed_state_bytes:
            return elements * self.fixed_state_bytes
        return elements * self.moments * param_state_bytes

    def state_formula(self, param_state_bytes: int) -> str:
        """Bytes per element of state, as text for the explanation."""
        if self.fixed_state_bytes:
            return f"{self.fixed_state_bytes:g} B (8-bit moments + fp32 absmax per 256-element block)"
        return f"{self.moments} moment(s) x {param_state_bytes} B"

    def temporaries_formula(self, impl: OptimizerImpl) -> str:
        """How the step temporaries are counted, as text for the explanation."""
        if self.fp32_step_copies:
            return (
                f"{self.fp32_step_copies} fp32 copies of the largest tensor "
                f"(+{self.upcast_copies} up-casts of 16-bit gradient and parameter)"
            )
        if self.fixed_state_bytes or impl is OptimizerImpl.FUSED or not self.moments:
            return "updated in place"
        if impl is OptimizerImpl.FOREACH:
            return f"{self.temp_copies} state-sized copy of every moment group (torch._foreach_sqrt)"
        return "2 state-sized copies of the largest tensor" if self.temp_copies else "updated in place"

    def step_temporary_bytes(self, impl: OptimizerImpl, elements: int, largest: int, state_bytes: int) -> float:
        """Extra bytes alive during ``optimizer.step()``."""
        if self.fp32_step_copies:
            upcasts = self.upcast_copies if state_bytes < 4 else 0
            return (self.fp32_step_copies + upcasts) * 4 * largest
        if self.fixed_state_bytes or impl is OptimizerImpl.FUSED or not self.moments:
            return 0.0
        if impl is OptimizerImpl.FOREACH:
            return self.temp_copies * elements * state_bytes
        return 2 * largest * state_bytes if self.temp_copies else 0.0


_EIGHT_BIT = 2 * (1 + 4 / 256)

OPTIMIZERS: dict[OptimizerName, OptimizerModel] = {
    OptimizerName.ADAMW: OptimizerModel(name=OptimizerName.ADAMW, moments=2),
    OptimizerName.ADAMW_8BIT: OptimizerModel(name=OptimizerName.ADAMW_8BIT, moments=0, fixed_state_bytes=_EIGHT_BIT),
    OptimizerName.PAGED_ADAMW: OptimizerModel(name=OptimizerName.PAGED_ADAMW, moments=2, paged=True, temp_copies=0),
    OptimizerName.PAGED_ADAMW_8BIT: OptimizerModel(
        name=OptimizerName.PAGED_ADAMW_8BIT, moments=0, fixed_state_bytes=_EIGHT_BIT, paged=True
    ),
    OptimizerName.ADAFACTOR: OptimizerModel(
        name=OptimizerName.ADAFACTOR, moments=0, fp32_step_copies=2, upcast_copies=2
    ),
    OptimizerName.SGD: OptimizerModel(name=OptimizerName.SGD, moments=1, temp_copies=0),
    OptimizerName.LION: OptimizerModel(name=OptimizerName.LION, moments=1, temp_copies=1),
}


def optimizer_model(name: OptimizerName) -> OptimizerModel:
    """The memory model of optimizer ``name``."""
    return OPTIMIZERS[name]


def in_backward_step_bytes(
    optimizer: OptimizerModel, impl: OptimizerImpl, elements: int, grad_bytes: int, state_bytes: int
) -> int:
    """Bytes alive inside one parameter's post-accumulate-grad hook with ``optimizer_in_backward``:
    its gradient (``elements x grad_bytes``) and the temporaries of a step over that one tensor
    (a foreach step over a one-tensor list copies that tensor only; Adafactor's fp32 copies).

    Units: elements of the tensor on this rank, bytes per element. Assumes one tensor is stepped
    at a time: torchtune's ``optimizer_in_bwd`` keeps one optimizer per parameter and steps it in
    ``register_post_accumulate_grad_hook``; forgather's ``fuse_optim_with_backward`` steps one
    optimizer whose only gradient is that parameter's, then ``zero_grad()`` (trainer.py
    ``optimzer_hook``). Measured on CPU: tests/estimator/test_optimizer_in_backward.py."""
    temporaries = optimizer.step_temporary_bytes(impl, elements, elements, state_bytes)
    return int(elements * grad_bytes + temporaries)
