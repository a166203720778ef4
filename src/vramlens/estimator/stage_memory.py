"""The named quantities of one pipeline stage and the terms that explain them (:class:`StageMemory`),
and the record of what filling some of them did (:class:`StageEffect`).

:mod:`vramlens.estimator.quantities` fills it, :mod:`vramlens.estimator.step_phases` reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal, get_args

from vramlens.categories import Category
from vramlens.estimator.fsdp import Unsharded
from vramlens.estimator.layout import StageView
from vramlens.estimator.logits import LogitsMemory
from vramlens.result.report import Term

if TYPE_CHECKING:
    pass

__all__ = [
    "SIZED_QUANTITIES",
    "WHOLE_STEP",
    "Formula",
    "StageEffect",
    "StageMemory",
    "Summed",
    "record_effect",
]

Formula = Callable[[], str] | str
#: When the quantities that do not come and go are alive.
WHOLE_STEP = "whole step"


#: The quantities that are sums of terms (:meth:`StageMemory.add` adds each term into one).
Summed = Literal[
    "params_bytes",
    "states_bytes",
    "grads_bytes",
    "grad_buckets_bytes",
    "activations_bytes",
    "non_layer_bytes",
    "head_side_bytes",
    "inputs_bytes",
    "casts_bytes",
    "dequant_bytes",
    "step_temp_bytes",
]


@dataclass(kw_only=True)
class StageMemory:
    """Named quantities of one pipeline stage (bytes), with the terms that explain them.

    Filled once by :func:`stage_memory` (or the generic families' ``generic_stage_memory``) and only
    read afterwards. A quantity in :data:`Summed` is the sum of its terms (:attr:`parts`); the
    others are instants' amounts that :mod:`vramlens.estimator.training` names with their formula
    (:attr:`formulas`) where a phase's high point holds them.
    """

    stage: StageView
    params_bytes: int = 0
    """Parameters on this rank: whole step."""
    states_bytes: int = 0
    """Optimizer state and fp32 master weights on the GPU: whole step."""
    paged_states_bytes: int = 0
    """Paged optimizer state (CUDA unified memory, outside the allocator: the device level)."""
    grads_bytes: int = 0
    """Gradients (sharded as the strategy shards them): from their layer's backward to the optimizer step."""
    grad_buckets_bytes: int = 0
    """Reduce / DDP buckets and accumulated unsharded gradients: whole step."""
    head_grads_bytes: int = 0
    """The LM head's gradient (full fine-tuning): from the head's backward, the first of backward."""
    layer_grads_bytes: int = 0
    mlp_out_grads_bytes: int = 0
    """The part of ``layer_grads_bytes`` that is the MLP output projection's: made first in a layer's
    backward, so already there when its MLP's gradients peak."""
    """Gradients of one decoder layer (full fine-tuning), produced last for the first layer."""
    activations_bytes: int = 0
    """Saved activations of the stage's layers: from their forward to their backward."""
    recompute_bytes: int = 0
    """A recomputed layer's tensors: inside that layer's backward."""
    non_layer_bytes: int = 0
    """Activations outside the decoder layers: from the forward to the end of backward."""
    head_side_bytes: int = 0
    """What the final norm and the LM head keep for backward (the norm's input and statistics, the
    head's input, a head adapter's inputs): from the forward to their own backward, which runs
    before any layer's, so none of it is alive in the layers' backward (tracked CPU runs of
    transformers and LitGPT steps: the peak inside a recomputed layer's backward holds none)."""
    inputs_bytes: int = 0
    """Input ids and labels: whole step."""
    logits: LogitsMemory | None = None
    head_cast_bytes: int = 0
    """The LM head's bf16 weight copy after k-bit preparation (part of ``logits``): the loss to the
    head's backward."""
    casts_bytes: int = 0
    """Autocast weight copies: the forward (autocast cache)."""
    casts_backward_bytes: int = 0
    """Autocast weight copies alive in backward (saved by layers that were not checkpointed)."""
    casts_last_layer_bytes: int = 0
    """Autocast weight copies alive in the first layer's backward, the last the backward reaches: that
    layer's own (every other layer's were freed with the tensors its backward used)."""
    autocast_head_copy_bytes: int = 0
    """The LM head's autocast copy (part of ``casts_backward_bytes``): freed by the head's backward."""
    autocast_down_copy_bytes: int = 0
    """One layer's MLP output projection's autocast copy (part of ``casts_backward_bytes``): freed by
    that projection's backward, before the layer's MLP backward peaks."""
    unsharded: Unsharded = field(default_factory=Unsharded)
    """Parameter sharding's unsharded parameters, buffers and gradients, instant by instant (fsdp.py)."""
    dequant_bytes: int = 0
    """A dequantized k-bit weight: inside one linear."""
    working_bytes: int = 0
    """A layer's backward working set: inside its backward."""
    end_working_bytes: int | None = None
    """The backward working set when only the embedding's backward is left (None: ``working_bytes``)."""
    forward_working_bytes: int = 0
    """A layer's forward working set (with the forward-only attention masks): inside its forward."""
    forward_besides_scores_bytes: int = 0
    """The part of ``forward_working_bytes`` that is not eager attention's score tensors (the MLP's
    and adapters' intermediates, the masks): what the allocator replay writes beside the score chain
    of a recomputed layer (:func:`vramlens.estimator.eager_attention.eager_score_chain`)."""
    final_norm_forward_bytes: int = 0
    """Inside the final norm's forward: the last layer's output, the norm's saved tensors and its
    intermediates (:mod:`vramlens.estimator.final_norm`; 0 where not written)."""
    final_output_bytes: int = 0
    """At the loss: the final norm's output the model's forward still holds beside the head's cast of it."""
    final_norm_backward_bytes: int = 0
    """Inside the final norm's backward: its saved fp32 input and rsqrt and the gradients it makes."""
    masks_bytes_per_token: float = 0.0
    """Attention masks alive during the forward only, bytes per token (see LayerActivations)."""
    mixer_backward_bytes_per_token: float = 0.0
    """A state mixer's scan backward beyond its layer, bytes per token on one rank (see
    LayerActivations): inside that layer's backward."""
    step_temp_bytes: int = 0
    """The optimizer step's temporaries: inside optimizer.step()."""
    hook_step_bytes: int = 0
    """With ``optimizer_in_backward``: the largest trainable tensor's gradient and the temporaries
    of its one-tensor step, inside that tensor's post-accumulate-grad hook (in backward)."""
    hook_end_bytes: int = 0
    """With ``optimizer_in_backward`` and a tied table: its gradient and step at the end of backward."""
    terms: list[Term] = field(default_factory=list)
    """Every quantity's terms, at their full size (the report's catalogue)."""
    parts: dict[str, list[Term]] = field(default_factory=dict)
    """The terms each :data:`Summed` quantity is the sum of."""
    formulas: dict[str, Formula] = field(default_factory=dict)
    """Formulas of the quantities that have no term of their own (working sets, recompute, ...)."""
    notes: list[str] = field(default_factory=list)
    derived: dict[object, object] = field(default_factory=dict, repr=False, compare=False)
    """Records derived from the stage's size-free quantities alone, memoized with them (keyed by
    their class; shared by every :class:`StageMemory` filled from one
    :class:`~vramlens.estimator.stage_plan.StagePlan`)."""

    def add(
        self,
        name: str,
        category: Category,
        value: float,
        formula: Formula,
        *,
        into: Summed | None = None,
        alive: str = "",
    ) -> int:
        """Record a term of ``int(value)`` bytes (none when 0) and add it into the quantity ``into``; its bytes."""
        amount = int(value)
        if amount:
            term = Term(name=name, category=category, bytes=amount, explain=formula, alive=alive)
            self.terms.append(term)
            if into is not None:
                self.parts.setdefault(into, []).append(term)
        if into is not None:
            setattr(self, into, getattr(self, into) + amount)
        return amount

    def apply(self, effect: StageEffect) -> None:
        """Do again what :func:`record_effect` recorded: as if its filling ran on this memory now."""
        self.terms.extend(effect.terms)
        for key, terms in effect.parts:
            self.parts.setdefault(key, []).extend(terms)
        for name, amount in effect.added:
            setattr(self, name, getattr(self, name) + amount)
        for name, value in effect.assigned:
            setattr(self, name, value)
        self.formulas.update(effect.formulas)
        self.notes.extend(effect.notes)


_SUMMED = frozenset(get_args(Summed))
_LISTS = frozenset({"stage", "terms", "parts", "formulas", "notes", "derived"})
#: The quantities :func:`~vramlens.estimator.quantities.stage_memory` sets for each workload (they
#: read the batch or the sequence length); every other field comes from the size-free effects.
SIZED_QUANTITIES = (
    "activations_bytes",
    "recompute_bytes",
    "masks_bytes_per_token",
    "mixer_backward_bytes_per_token",
    "inputs_bytes",
    "non_layer_bytes",
    "head_side_bytes",
    "logits",
    "head_cast_bytes",
    "working_bytes",
    "forward_working_bytes",
    "forward_besides_scores_bytes",
    "final_norm_forward_bytes",
    "final_output_bytes",
    "final_norm_backward_bytes",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class StageEffect:
    """What filling some quantities did to a :class:`StageMemory`, to do again on another one
    (:meth:`StageMemory.apply`): the terms added (and which quantity each went into), the sums'
    increments, the other quantities' values, formulas and notes. The estimator memoizes the
    effect of the parts that read neither batch nor sequence length (weights, optimizer state,
    gradients, gathered shards, step temporaries) on the resolved model."""

    terms: tuple[Term, ...]
    parts: tuple[tuple[str, tuple[Term, ...]], ...]
    added: tuple[tuple[str, int], ...]
    assigned: tuple[tuple[str, object], ...]
    formulas: tuple[tuple[str, Formula], ...]
    notes: tuple[str, ...]


def record_effect(stage: StageView, fill: Callable[[StageMemory], None]) -> StageEffect:
    """The effect of ``fill`` on an empty :class:`StageMemory` of ``stage``."""
    scratch, empty = StageMemory(stage=stage), StageMemory(stage=stage)
    fill(scratch)
    changed = [f.name for f in fields(StageMemory) if f.name not in _LISTS]
    changed = [name for name in changed if getattr(scratch, name) != getattr(empty, name)]
    return StageEffect(
        terms=tuple(scratch.terms),
        parts=tuple((key, tuple(terms)) for key, terms in scratch.parts.items()),
        added=tuple((name, getattr(scratch, name)) for name in changed if name in _SUMMED),
        assigned=tuple((name, getattr(scratch, name)) for name in changed if name not in _SUMMED),
        formulas=tuple(scratch.formulas.items()),
        notes=tuple(scratch.notes),
    )
