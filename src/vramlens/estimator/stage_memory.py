"""The named quantities of one pipeline stage and the terms that explain them (:class:`StageMemory`),
and what is memoized to fill them (:class:`StagePlan`).

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
from vramlens.estimator.memo_keys import SizeFreeInputs
from vramlens.estimator.recompute import LayerActivations
from vramlens.estimator.ring_attention import ring_backward_bytes
from vramlens.model.modules import layer_linears
from vramlens.resolve._memo import memo
from vramlens.resolve.context import TrainingContext
from vramlens.result.report import Term
from vramlens.units import format_bytes

if TYPE_CHECKING:
    from vramlens.estimator.logits_terms import LossPlan

__all__ = [
    "SIZED_QUANTITIES",
    "WHOLE_STEP",
    "Formula",
    "StageEffect",
    "StageMemory",
    "Summed",
    "record_effect",
    "size_free_effect",
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
    "inputs_bytes",
    "casts_bytes",
    "dequant_bytes",
    "step_temp_bytes",
]


@dataclass(kw_only=True)
class StageMemory:
    """Named quantities of one pipeline stage (bytes), with the terms that explain them.

    Filled once by :func:`stage_memory` (or the generic families' ``generic_stage_memory``) and only
    read afterwards. A quantity in :data:`Summed` is the sum of its terms (:meth:`terms_of`); the
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
    """Gradients of one decoder layer (full fine-tuning), produced last for the first layer."""
    activations_bytes: int = 0
    """Saved activations of the stage's layers: from their forward to their backward."""
    recompute_bytes: int = 0
    """A recomputed layer's tensors: inside that layer's backward."""
    non_layer_bytes: int = 0
    """Activations outside the decoder layers: from the forward to the end of backward."""
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
    :class:`~vramlens.estimator.quantities.StagePlan`)."""

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

    def terms_of(self, quantity: Summed) -> tuple[Term, ...]:
        """The terms ``quantity`` is the sum of."""
        return tuple(self.parts.get(quantity, ()))

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
    "logits",
    "head_cast_bytes",
    "working_bytes",
    "forward_working_bytes",
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


def size_free_effect(
    ctx: TrainingContext, stage: StageView, keys: tuple[object, ...], part: str, fill: Callable[[StageMemory], None]
) -> StageEffect:
    """The effect of ``fill``, a part of ``stage``'s quantities that reads neither batch nor sequence
    length, memoized on the model; ``keys``: :meth:`SizeFreeInputs.workload_keys` of the context's workload."""
    return memo(
        ctx.spec, SizeFreeInputs(part=part, stage=stage.name, workload=keys), lambda: record_effect(stage, fill)
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkingSet:
    """A layer's working sets at one sequence length, bytes per token (see :func:`working_set`):
    backward and forward before tensor parallelism, the scan backward and forward-only masks already
    per rank, and on one rank (``max(backward / tp, scan)``, ``forward / tp + masks``)."""

    backward: float
    forward: float
    scan: float
    masks: float
    backward_per_rank: float
    forward_per_rank: float


@dataclass(frozen=True, kw_only=True, slots=True)
class AtSeq:
    """The per-token amounts of one stage at one sequence length (what reads the sequence length
    but not the batch): saved activations, the working sets without and with a recomputed layer
    (indexed by that), the loss (last stage)."""

    acts: LayerActivations
    working: tuple[WorkingSet, WorkingSet]
    loss: LossPlan | None


@dataclass(frozen=True, kw_only=True, slots=True)
class StagePlan:
    """What one stage's quantities read besides batch and sequence length (memoized on the model by
    :class:`~vramlens.estimator.memo_keys.SizeFreeInputs`): the size-free quantities' effects, the
    micro-batches in flight, the bytes per token outside the layers; and, by sequence length, the
    per-token amounts (:class:`AtSeq`)."""

    stage: StageView
    weights: StageEffect
    transients: StageEffect
    in_flight: float
    outside_per_token: float
    whole_layer: bool
    """Full recompute or offload: a recomputed layer's tensors are the transient (when it has any)."""
    notes: tuple[str, ...]
    by_seq: dict[int, AtSeq] = field(default_factory=dict, compare=False, repr=False)
    derived: dict[object, object] = field(default_factory=dict, compare=False, repr=False)
    """Records derived from this plan alone (:attr:`StageMemory.derived`)."""
    filled: StageMemory = field(init=False, compare=False, repr=False)
    """A memory with both effects applied (what :meth:`memory` copies)."""

    def __post_init__(self) -> None:
        filled = StageMemory(stage=self.stage, derived=self.derived)
        filled.apply(self.weights)
        filled.apply(self.transients)
        object.__setattr__(self, "filled", filled)

    def memory(self) -> StageMemory:
        """A new memory of the stage as the weights effect, then the transients effect, leave it, but
        for the terms and notes, which are the weights effect's (the caller adds the sized ones, then
        :meth:`finish`): the sized quantities are none of the effects'."""
        filled = self.filled
        mem = object.__new__(StageMemory)
        vars(mem).update(vars(filled))
        mem.terms = list(self.weights.terms)
        mem.parts = {key: list(terms) for key, terms in filled.parts.items()}
        mem.formulas = dict(filled.formulas)
        mem.notes = list(self.weights.notes)
        return mem

    def finish(self, mem: StageMemory) -> None:
        """Append the transients effect's terms and notes (after the sized ones, in the order the
        quantities are computed)."""
        mem.terms.extend(self.transients.terms)
        mem.notes.extend(self.transients.notes)


def working_sets(ctx: TrainingContext, mem: StageMemory, working: WorkingSet) -> None:
    """A layer's backward and forward working sets for ``ctx``'s tokens (:func:`_working_set`); the
    backward at least ring attention's (context parallel)."""
    tokens, tp = ctx.tokens, ctx.workload.parallel.tp
    ring = ring_backward_bytes(ctx)
    mem.working_bytes = max(int(tokens * working.backward_per_rank), ring)
    mem.forward_working_bytes = int(tokens * working.forward_per_rank)
    backward, forward, scan, masks = working.backward, working.forward, working.scan, working.masks
    mem.formulas["working_bytes"] = lambda: (
        f"max({backward:,.0f} B/token / tp {tp}, scan backward {scan:,.0f} B/token) x {tokens:,} tokens"
        + (f"; ring attention backward (cp {ctx.workload.parallel.cp}) {format_bytes(ring)} if larger" if ring else "")
    )
    mem.formulas["forward_working_bytes"] = lambda: (
        f"({forward:,.0f} B/token / tp {tp} + masks {masks:,.0f} B/token) x {tokens:,} tokens"
    )


def working_set(
    ctx: TrainingContext,
    targets: frozenset[str],
    acts: LayerActivations,
    eager: tuple[float, float, float],
    recompute: bool,
) -> WorkingSet:
    """Intermediates of the layer being computed that nobody keeps (measured on CPU for
    transformers' Llama layer, see tests/estimator/test_training_hf.py), bytes per token:

    * backward: gradients flowing through the MLP (two ``a*i`` tensors) and the hidden
      state (two ``a*h``); with recompute the recomputed layer's own tensors are freed as
      its backward proceeds, leaving ``a*(i + h)``, plus the adapters' output gradient;
    * forward: the norm's fp32 intermediate and the layer output (``4h + a*h``), or the
      LoRA adapter sums on the MLP if larger; under recompute nothing is kept, so the
      MLP's live intermediates (``2*a*i + a*h``) plus the adapter sums;
    * a state mixer's scan backward (Mamba 1's gradient buffers), beside its layer less what that
      layer freed before it (``acts.mixer_backward_per_token``, :func:`vramlens.estimator.recompute.scan_backward_beyond`).

    ``recompute``: a recomputed layer's tensors are counted as the transient (full recompute or
    offload keeps no layer's internals: its MLP intermediates are transient; selective recompute
    keeps them as saved activations)."""
    spec, a, tp = ctx.spec, ctx.compute_bytes, ctx.workload.parallel.tp
    h = spec.hidden_size
    inner = spec.mlp.intermediate_size if spec.mlp else spec.moe.expert_intermediate_size * spec.moe.experts_per_token  # type: ignore[union-attr]
    adapter_sum, adapter_grad = _adapter_transients(ctx, targets, inner)
    backward = a * (inner + h) + adapter_grad if recompute else a * (2 * inner + 2 * h)
    forward = (a * h + 2 * a * inner + adapter_sum) if recompute else max(4 * h + a * h, adapter_sum)
    # Eager attention's score tensors come and go apart from the MLP's intermediates; a recomputed
    # layer's forward runs inside the backward pass, its kept tensors counted as the transient.
    over_kept, eager_backward, eager_forward = eager
    forward = max(forward, eager_forward if recompute else over_kept)
    backward = max(backward, eager_backward, over_kept if recompute else 0)
    scan, masks = acts.mixer_backward_per_token, acts.masks_per_token
    return WorkingSet(
        backward=backward,
        forward=forward,
        scan=scan,
        masks=masks,
        backward_per_rank=max(backward / tp, scan),
        forward_per_rank=forward / tp + masks,
    )


def _adapter_transients(ctx: TrainingContext, targets: frozenset[str], inner: int) -> tuple[float, float]:
    """Bytes per token of PEFT's ``result + lora_B(lora_A(x)) * scaling`` on an MLP input
    projection: (forward: base output, scaled adapter output and promoted sum; backward:
    the adapter output's gradient). ``d`` is 4 for fp32 adapters, 2 for bf16 or under autocast."""
    if not targets or not any(
        s.group == "mlp_in" and s.name in targets for s in layer_linears(ctx.spec, moe_layer=not ctx.spec.mlp)
    ):
        return 0.0, 0.0
    d = 2 if ctx.autocast or not ctx.profile.adapters_fp32 else 4
    return (2 * d + ctx.compute_bytes) * inner, d * inner
