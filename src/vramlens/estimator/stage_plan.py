"""What an estimate keeps for one pipeline stage, and the stage's quantities that read the sizes.

:class:`StagePlan` (one per model, size-free workload keys and stage: made by
:func:`vramlens.estimator.quantities.stage_plan`) holds the size-free quantities' effects, the
micro-batches in flight and the bytes per token outside the layers; :class:`AtSeq` the per-token
amounts at one sequence length (or at every length, when they read none: a build with symbols for
the sizes shows it, :func:`vramlens.estimator.size_symbols.reads_no_size`). :func:`sized_amounts`
multiplies them by a workload's tokens once: the sized quantities, from which :func:`fill_terms`
makes their terms and formulas, or :meth:`StagePlan.numbers` a memory of the quantities alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import NamedTuple, cast

from vramlens.categories import Category
from vramlens.estimator.final_norm import FinalNormPerToken, stream_bytes
from vramlens.estimator.layout import StageView
from vramlens.estimator.logits_terms import LossAmounts, LossPlan, loss_plan
from vramlens.estimator.lora_head import only_the_head_trains
from vramlens.estimator.mlp_working import (
    adapter_transients,
    down_adapter_cast,
    full_mlp_backward,
    recomputed_mlp_backward,
)
from vramlens.estimator.recompute import LayerActivations, eager_attention_working, layer_activations, train_state
from vramlens.estimator.ring_attention import ring_backward_bytes
from vramlens.estimator.stage_memory import WHOLE_STEP, StageEffect, StageMemory
from vramlens.resolve._memo import MEMO_LIMIT
from vramlens.resolve.context import TrainingContext
from vramlens.units import format_bytes

__all__ = [
    "AtSeq",
    "SizedAmounts",
    "StagePlan",
    "WorkingSet",
    "at_seq",
    "build_at_seq",
    "fill_terms",
    "sized_amounts",
    "working_set",
]


class SizedAmounts(NamedTuple):
    """A stage's quantities that read the sizes, bytes (a named tuple: one is made per estimate)."""

    activations: int
    recompute: int
    masks: float
    mixer: float
    inputs: int
    outside: int
    head_side: int
    head_input: int
    logits: LossAmounts | None
    working: int
    forward_working: int
    forward_besides_scores: int
    final_norm: tuple[int, int, int]
    """The final norm's forward high point, output held at the loss and backward high point."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkingSet:
    """A layer's working sets at one sequence length, bytes per token (see :func:`working_set`):
    backward and forward before tensor parallelism, the scan backward and forward-only masks already
    per rank, and on one rank (``max(backward / tp, scan)``, ``forward / tp + masks``, and the latter
    without eager attention's score tensors)."""

    backward: float
    forward: float
    scan: float
    masks: float
    backward_per_rank: float
    forward_per_rank: float
    besides_scores_per_rank: float


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
    """Rotary tables (the first stage): alive to the end of backward."""
    head_side_per_token: float
    """The final norm's saved tensors and the head's input (the last stage): to the head's backward."""
    final_norm: FinalNormPerToken
    """The final norm's own instants (the last stage; zeros elsewhere), per token on one rank."""
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

    def numbers(self, amounts: SizedAmounts) -> StageMemory:
        """A memory of the stage's quantities for the sized ``amounts`` but no term, formula or note:
        an estimate's figures (its terms are made from :meth:`memory` when they are read)."""
        filled = self.filled
        mem = object.__new__(StageMemory)
        vars(mem).update(vars(filled))
        mem.activations_bytes = filled.activations_bytes + amounts.activations
        mem.recompute_bytes = amounts.recompute
        mem.masks_bytes_per_token, mem.mixer_backward_bytes_per_token = amounts.masks, amounts.mixer
        mem.inputs_bytes = filled.inputs_bytes + amounts.inputs
        mem.non_layer_bytes = filled.non_layer_bytes + amounts.outside
        mem.head_side_bytes = filled.head_side_bytes + amounts.head_side + amounts.head_input
        if amounts.logits is not None:
            mem.logits, mem.head_cast_bytes = amounts.logits.kept, amounts.logits.cast_bytes
        mem.working_bytes, mem.forward_working_bytes = amounts.working, amounts.forward_working
        mem.forward_besides_scores_bytes = amounts.forward_besides_scores
        _final_norm(mem, amounts)
        return mem

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


def working_set(
    ctx: TrainingContext,
    targets: frozenset[str],
    acts: LayerActivations,
    eager: tuple[float, float, float],
    recompute: bool,
) -> WorkingSet:
    """Intermediates of the layer being computed that nobody keeps (measured on CPU for
    transformers' Llama layer, see tests/estimator/test_training_hf.py), bytes per token:

    * backward: a full fine-tune's dense MLP as :func:`~vramlens.estimator.mlp_working.full_mlp_backward`
      says; otherwise gradients flowing through the MLP (two ``a*i`` tensors) and the hidden
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
    adapter_sum, adapter_grad = adapter_transients(ctx, targets, inner)
    dense = spec.mlp is not None and not spec.is_moe
    if recompute and dense:
        backward = recomputed_mlp_backward(ctx, targets, inner, adapter_grad)
    elif dense and ctx.full and not recompute:
        backward = full_mlp_backward(spec, inner, compute=a, stream=stream_bytes(ctx))
    else:
        backward = a * (inner + h) + adapter_grad if recompute else a * (2 * inner + 2 * h)
    forward = (
        (a * h + 2 * a * inner + adapter_sum)
        if recompute
        else max(4 * h + a * h, adapter_sum, down_adapter_cast(ctx, targets, inner) if dense else 0.0)
    )
    # Eager attention's score tensors come and go apart from the MLP's intermediates; a recomputed
    # layer's forward runs inside the backward pass, its kept tensors counted as the transient.
    over_kept, eager_backward, eager_forward = eager
    scan, masks = acts.mixer_backward_per_token, acts.masks_per_token
    besides_scores = forward / tp + masks
    forward = max(forward, eager_forward if recompute else over_kept)
    backward = max(backward, eager_backward, over_kept if recompute else 0)
    return WorkingSet(
        backward=backward,
        forward=forward,
        scan=scan,
        masks=masks,
        backward_per_rank=max(backward / tp, scan),
        forward_per_rank=forward / tp + masks,
        besides_scores_per_rank=besides_scores,
    )


def build_at_seq(ctx: TrainingContext, *, stage: StageView, targets: frozenset[str], memoized: bool = True) -> AtSeq:
    state = train_state(ctx, targets)
    acts = layer_activations(ctx, state, stage.layer_range, memoized=memoized)
    head_only = only_the_head_trains(ctx, targets)
    if head_only:
        acts = LayerActivations(
            saved_per_token=0.0,
            transient_per_token=0.0,
            full_layer_parts=acts.full_layer_parts,
            notes=("only the head trains: no layer activations are kept",),
        )
    loss = loss_plan(ctx, targets) if stage.last else None
    eager = eager_attention_working(ctx, state, stage.layer_range)
    working = (working_set(ctx, targets, acts, eager, False), working_set(ctx, targets, acts, eager, True))
    if head_only:  # no layer keeps anything (as under recompute) and none runs backward
        unkept = replace(working[1], backward=0.0, scan=0.0, backward_per_rank=0.0)
        working = (unkept, unkept)
    return AtSeq(acts=acts, working=working, loss=loss)


def _at_seq_key(at: AtSeq) -> object:
    """``at`` comparable (a loss's ``logits_memory`` partial by its arguments)."""
    loss = at.loss
    if loss is None or loss.logits is None:
        return at.acts, at.working, loss
    return at.acts, at.working, (loss.note, loss.head, loss.cast_bytes, loss.logits.args, loss.logits.keywords)


#: ``StagePlan.derived`` key of the per-token amounts when they read no sequence length (or None).
_SEQ_FREE = "stage: per-token amounts that read no sequence length"


def _new_at_seq(ctx: TrainingContext, stage: StageView, targets: frozenset[str], plan: StagePlan) -> AtSeq:
    """The :class:`AtSeq` of a sequence length the plan has not seen. At the second one, whether
    they read the sequence length at all: built once more with symbols for the batch and the
    sequence length (:mod:`vramlens.estimator.size_symbols`), an :class:`AtSeq` that reads neither
    is the same as the one built for this length, and then serves every length."""
    at = build_at_seq(ctx, stage=stage, targets=targets)
    if len(plan.by_seq) == 1 and _SEQ_FREE not in plan.derived:
        from vramlens.estimator.size_symbols import reads_no_size

        build = partial(build_at_seq, stage=stage, targets=targets, memoized=False)
        plan.derived[_SEQ_FREE] = at if reads_no_size(build, ctx, at, _at_seq_key) else None
    if len(plan.by_seq) >= MEMO_LIMIT:
        plan.by_seq.clear()
    plan.by_seq[ctx.workload.seq] = at
    return at


def at_seq(ctx: TrainingContext, stage: StageView, targets: frozenset[str], plan: StagePlan) -> AtSeq:
    """The per-token amounts of ``ctx``'s sequence length (memoized on the plan)."""
    found = plan.by_seq.get(ctx.workload.seq) or cast("AtSeq | None", plan.derived.get(_SEQ_FREE))
    return found if found is not None else _new_at_seq(ctx, stage, targets, plan)


def sized_amounts(ctx: TrainingContext, plan: StagePlan, at: AtSeq) -> SizedAmounts:
    """The stage's sized quantities for ``ctx``'s tokens: the per-token amounts times the tokens,
    as :func:`int` of the same expressions the terms show."""
    tokens, acts, norm = ctx.tokens, at.acts, plan.final_norm
    recompute = int(acts.transient_per_token * tokens)
    working = at.working[plan.whole_layer and recompute > 0]
    logits = at.loss.amounts(ctx) if at.loss is not None else None
    return SizedAmounts(
        activations=int(acts.saved_per_token * tokens * plan.in_flight),
        recompute=recompute,
        masks=acts.masks_per_token,
        mixer=acts.mixer_backward_per_token,
        inputs=16 * tokens,
        outside=int(plan.outside_per_token * tokens),
        head_side=int(plan.head_side_per_token * tokens),
        head_input=logits.head_input if logits is not None else 0,
        logits=logits,
        working=max(int(tokens * working.backward_per_rank), ring_backward_bytes(ctx)),
        forward_working=int(tokens * working.forward_per_rank),
        forward_besides_scores=int(tokens * working.besides_scores_per_rank),
        final_norm=(int(norm.forward * tokens), int(norm.held_at_loss * tokens), int(norm.backward * tokens)),
    )


def fill_terms(ctx: TrainingContext, mem: StageMemory, plan: StagePlan, at: AtSeq, amounts: SizedAmounts) -> None:
    """The sized quantities' terms and formulas on ``mem`` (:meth:`StagePlan.memory`), in the order
    the quantities are computed: activations, inputs and outside the layers, the loss, the
    transients effect's terms, the working sets."""
    tokens, acts, stage, in_flight = ctx.tokens, at.acts, mem.stage, plan.in_flight
    mem.add(
        "activations (saved for backward)",
        Category.ACTIVATIONS,
        amounts.activations,
        lambda: (
            f"{acts.saved_per_token:,.0f} B/token x {tokens:,} tokens x {in_flight:g} micro-batch(es) in flight ({stage.layers} layers)"
        ),
        into="activations_bytes",
        alive="from each layer's forward to its backward",
    )
    mem.recompute_bytes = amounts.recompute
    mem.formulas["recompute_bytes"] = lambda: f"{acts.transient_per_token:,.0f} B/token x {tokens:,} tokens"
    mem.masks_bytes_per_token, mem.mixer_backward_bytes_per_token = amounts.masks, amounts.mixer
    mem.add(
        "inputs (ids, labels)",
        Category.INPUTS,
        amounts.inputs,
        lambda: f"{tokens:,} tokens x 2 int64",
        into="inputs_bytes",
        alive=WHOLE_STEP,
    )
    outside, head_side = plan.outside_per_token, plan.head_side_per_token
    mem.add(
        "activations outside the layers (rotary tables)",
        Category.ACTIVATIONS,
        amounts.outside,
        lambda: f"{outside:,.0f} B/token",
        into="non_layer_bytes",
        alive="from the forward to the end of backward",
    )
    mem.add(
        "final norm and head inputs (saved)",
        Category.ACTIVATIONS,
        amounts.head_side,
        lambda: f"{head_side:,.0f} B/token",
        into="head_side_bytes",
        alive="from the final norm's forward to the head's and its own backward (before the layers')",
    )
    mem.notes.extend(acts.notes)
    mem.notes.extend(plan.notes)
    if at.loss is not None and amounts.logits is not None:
        at.loss.fill(mem, amounts.logits)
    plan.finish(mem)
    _working_sets(ctx, mem, at.working[plan.whole_layer and amounts.recompute > 0], amounts)
    _final_norm(mem, amounts)
    norm = plan.final_norm
    for key, per_token in zip(_FINAL_NORM, (norm.forward, norm.held_at_loss, norm.backward), strict=True):
        mem.formulas[key] = f"{per_token:,.0f} B/token x {tokens:,} tokens"


#: The :class:`StageMemory` quantities of :attr:`SizedAmounts.final_norm`, in its order.
_FINAL_NORM = ("final_norm_forward_bytes", "final_output_bytes", "final_norm_backward_bytes")


def _final_norm(mem: StageMemory, amounts: SizedAmounts) -> None:
    """The final norm's instants' amounts on ``mem`` (:mod:`vramlens.estimator.final_norm`)."""
    mem.final_norm_forward_bytes, mem.final_output_bytes, mem.final_norm_backward_bytes = amounts.final_norm


def _working_sets(ctx: TrainingContext, mem: StageMemory, working: WorkingSet, amounts: SizedAmounts) -> None:
    """A layer's backward and forward working sets (:func:`working_set`); the backward at least ring
    attention's (context parallel), and their formulas."""
    tokens, tp = ctx.tokens, ctx.workload.parallel.tp
    mem.working_bytes, mem.forward_working_bytes = amounts.working, amounts.forward_working
    mem.forward_besides_scores_bytes = amounts.forward_besides_scores
    ring = ring_backward_bytes(ctx)
    backward, forward, scan, masks = working.backward, working.forward, working.scan, working.masks
    mem.formulas["working_bytes"] = lambda: (
        f"max({backward:,.0f} B/token / tp {tp}, scan backward {scan:,.0f} B/token) x {tokens:,} tokens"
        + (f"; ring attention backward (cp {ctx.workload.parallel.cp}) {format_bytes(ring)} if larger" if ring else "")
    )
    mem.formulas["forward_working_bytes"] = lambda: (
        f"({forward:,.0f} B/token / tp {tp} + masks {masks:,.0f} B/token) x {tokens:,} tokens"
    )
