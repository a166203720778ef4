"""The tensors a training step's terms imply, tensor by tensor: what the allocator is asked for.

The estimator's terms are totals at instants (:mod:`vramlens.estimator.quantities`); the caching
allocator's slack depends on the individual requests behind them. :func:`step_shape` lists them
from the same sources the terms come from: parameter tensors from the model's linears and norms
(:mod:`vramlens.model.modules`), saved activations from the layer recipe's parts
(:mod:`vramlens.estimator.recompute`), logits from the loss implementation
(:mod:`vramlens.estimator.logits`), and the optimizer's moments per parameter tensor
(:mod:`vramlens.estimator.optimizers`). :mod:`vramlens.estimator.step_pattern` orders them into a
step. Bytes are ``int``; "per layer" lists hold one decoder layer's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramlens.allocator.streams import Stream
from vramlens.estimator.fsdp import accumulates_unsharded, resolved_wrap, units, uses_fsdp2
from vramlens.estimator.layer_script import ForwardScript
from vramlens.estimator.layout import EMBED_NAMES, StageView
from vramlens.estimator.lora_head import HEAD_NAMES, only_the_head_trains
from vramlens.estimator.optimizers import optimizer_model
from vramlens.estimator.quantities import StageMemory
from vramlens.estimator.step_layers import EagerChain, Saved, saved_tensors, score_chain, tensor_widths
from vramlens.estimator.step_weights import resident_weights, unsharded_params
from vramlens.model.spec import LayerKind
from vramlens.resolve._memo import memo
from vramlens.resolve.context import TrainingContext
from vramlens.workload.options import FsdpWrap, Offload, OptimizerImpl, Recompute, Shard

__all__ = ["StepShape", "step_shape"]

_PARAM_SHARDED = {Shard.ZERO3, Shard.FSDP, Shard.HSDP}
_GRAD_SHARDED = _PARAM_SHARDED | {Shard.ZERO2}
_STATE_SHARDED = _GRAD_SHARDED | {Shard.ZERO1}


@dataclass(frozen=True, kw_only=True, slots=True)
class StepShape:
    """One stage's step as allocator requests (bytes per tensor on this rank; trained tensors in elements)."""

    layers: int
    edge_params: tuple[int, ...]
    """The embedding (first stage), the head (last stage, untied), then the rest of a frozen
    unquantized base outside the layers (the final norm and the like; resident)."""
    layer_params: tuple[tuple[int, ...], ...]
    """Each layer kind's resident weights (frozen base or trained), in module order."""
    layer_trained: tuple[tuple[int, ...], ...]
    """Each layer kind's trained tensors in elements (full: the weights; LoRA: A and B per target)."""
    edge_trained: tuple[int, ...]
    """Trained vocabulary matrices in elements: the embedding first, the head last."""
    extra_trained: tuple[int, ...]
    """Trained elements neither the layers' lists nor the vocabulary matrices hold (the final norm,
    a PEFT prompt encoder or other adapters), as one tensor; its gradient is made at the end of the
    backward (empty with sharded parameters or without layers)."""
    embedding_trained: bool
    head_trained: bool
    tied_grads: bool
    """One GPU or replicated parameters: the trained embedding is the head's weight (tied), so its
    gradient is the out-of-place sum of the head's contribution (held through the backward) and the
    embedding's own (``torch.autograd``'s input buffer)."""
    adapter_params: bool
    """Trained tensors are parameters of their own beside the resident weights (PEFT)."""
    param_bytes: int
    grad_bytes: int
    state_bytes: int
    moments: int
    master_bytes: int
    foreach: bool
    per_tensor_copies: int
    """Temporaries a per-tensor step makes of each tensor (0: in place, fused)."""
    saved: tuple[tuple[int, ...], ...]
    """Each activation kind's saved tensors (the recipe's parts as tensors; the layer input under recompute)."""
    saved_kind: tuple[int, ...]
    """The index into ``saved`` of each of the stage's layers (empty: layers cycle through ``saved``)."""
    adapter_sums: tuple[tuple[tuple[int, int, int], ...], ...]
    """For each entry of ``saved``: PEFT's adapter sums of each adapted linear in module order, as
    (its base output is made before saved tensor n, its sum after saved tensor m, out elements x
    tokens) (empty without LoRA or under recompute)."""
    forward_scripts: tuple[ForwardScript | None, ...]
    """For each entry of ``saved``: its layers' forward in code order, the saved tensors among the
    tensors nobody keeps (:func:`~vramlens.estimator.layer_script.lora_forward_script`), or None
    where the layer is written from ``saved`` and ``adapter_sums``."""
    eager_chains: tuple[EagerChain | None, ...]
    """For each entry of ``saved`` written from it: eager attention's score chain in place of the
    tensors it keeps (:func:`~vramlens.estimator.step_layers.eager_chain`), or None (a fused kernel,
    a scripted layer, or a layer the chain does not describe)."""
    compute_bytes: int
    """Bytes per element of activations (the compute dtype)."""
    adapter_bytes: int
    """Bytes per element of an adapter's output (4: fp32 adapters; 2 under autocast or bf16 ones)."""
    recomputed: tuple[int, ...]
    """What one recomputed layer re-creates in backward (empty without recompute)."""
    casts: tuple[int, ...]
    """Autocast bf16 weight copies of one layer (full mixed-precision training)."""
    casts_kept: bool
    """A layer's copies stay until its backward (no recompute); else the cache drops them after forward."""
    head_cast: int
    forward_working: int
    """A layer's forward working set written as tensors after its saved ones (besides the score
    tensors when a score chain writes them)."""
    score_chain: tuple[tuple[str, str, int], ...]
    """Eager attention's score tensors in a recomputed layer's first forward, in code order, the
    probabilities (``probs``) left alive to the end of the layer
    (:func:`~vramlens.estimator.step_layers.score_chain`; empty otherwise)."""
    working: int
    hidden: int
    """One hidden state of the micro-batch (the residual stream between layers)."""
    widths: tuple[int, ...]
    """The layer's natural activation tensors of the micro-batch, bytes, largest first (the working
    sets are written as these: :func:`~vramlens.estimator.step_layers.tensor_widths`)."""
    non_layer: int
    inputs: int
    dequant: int
    gather_edges: int
    """FSDP1 / ZeRO-3: the root unit (embedding and head), gathered on the all-gather stream for the step."""
    gather_layer: int
    gather_layer_grads: int
    gather_embedding: int
    """FSDP2: the input embedding's own unit (its all-gather output and parameters; 0 when tied or absent)."""
    gather_tail: int
    """FSDP2: the tail unit (final norm, head, the tied embedding), kept gathered from forward into backward."""
    unsharded_layer: tuple[tuple[int, ...], ...]
    """FSDP2: each layer kind's unsharded parameters, tensor by tensor (copy-out, compute stream)."""
    unsharded_grads: tuple[tuple[int, ...], ...]
    """FSDP2: each layer kind's unsharded gradients, tensor by tensor (autograd, compute stream)."""
    tail_tensors: tuple[int, ...]
    """FSDP2: the tail unit's unsharded parameters (final norm, head or tied embedding), bytes."""
    tail_norm: int
    """FSDP2: elements of the tail unit's trained final norm, reduced with the head (0 when frozen)."""
    tied: bool
    """FSDP2: the embedding is tied to the head, in the tail unit."""
    unsharded_bytes: int
    """Bytes per element of unsharded parameters and their gradients (FSDP's ``param_dtype``)."""
    no_sync: bool
    """FSDP2 under a trainer that accumulates micro-steps without gradient sync (unsharded gradients kept)."""
    loss_in_model: bool
    """The loss runs inside the model's forward (HF), before the root's post-forward."""
    gather_copy_out: bool
    """FSDP2 (:func:`~vramlens.estimator.fsdp.uses_fsdp2` or the ``split`` wrapping): a unit's all-gather output
    (all-gather stream) is copied out into its parameters on the compute stream; else (FSDP1,
    ZeRO-3) the gathered unit itself is made on the all-gather stream."""
    reduce_bytes: int
    """Bytes per element of the reduce-scatter's input and output (FSDP's ``reduce_dtype``)."""
    grad_stream: int
    """Stream the sharded gradients are made on (:class:`~vramlens.allocator.streams.Stream`)."""
    grads_sharded: int
    states_sharded: int
    in_backward: bool
    below_head: bool
    """Gradients flow below the head (false when only the head trains: autograd records no layer)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _StageKinds:
    """The memo key of :func:`_kinds`."""

    layer_range: range


def _kinds(ctx: TrainingContext, stage: StageView) -> list[LayerKind]:
    """The (mixer, FFN) kind of each layer kind, in order: two kinds where layers alternate (MoE and
    dense, sliding and global attention, Mamba and attention), else one (memoized on the spec)."""
    return memo(ctx.spec, _StageKinds(layer_range=stage.layer_range), lambda: _layer_kinds(ctx, stage))


def _layer_kinds(ctx: TrainingContext, stage: StageView) -> list[LayerKind]:
    kinds = [ctx.spec.layers[i].kind for i in stage.layer_range]
    windows = [ctx.spec.layers[i].window for i in stage.layer_range]
    period = 2 if len(set(zip(kinds, windows, strict=True))) > 1 else 1
    return kinds[:period] or [LayerKind()]


def _trained_edges(ctx: TrainingContext, stage: StageView) -> tuple[bool, bool, tuple[int, ...]]:
    """(embedding trained, head trained, their elements: embedding first)."""
    spec = ctx.spec
    table = spec.vocab_size * spec.hidden_size // ctx.workload.parallel.tp
    tied = spec.tie_word_embeddings
    if ctx.full:
        embedding, head = stage.first, stage.last and not (tied and stage.first)
    else:
        saved = set(ctx.workload.lora.modules_to_save)
        embedding = stage.first and bool(saved & EMBED_NAMES)
        head = stage.last and bool(saved - EMBED_NAMES)
    return embedding, head, (table,) * (embedding + head)


def _extra_trained(
    ctx: TrainingContext,
    stage: StageView,
    layer_trained: list[tuple[int, ...]],
    edges: tuple[int, ...],
    targets: frozenset[str],
) -> tuple[int, ...]:
    """The stage's trained elements beyond its layers' trained tensors (layers cycling through the
    kinds) and the vocabulary matrices: a LoRA adapter on the head as its A (r x h) and B (V x r)
    tensors, the rest (final norm, prompt encoders, other adapters) as one tensor."""
    spec, rank = ctx.spec, ctx.workload.lora.rank
    listed = sum(sum(layer_trained[i % len(layer_trained)]) for i in range(stage.layers)) if layer_trained else 0
    rest = sum(group.elements for group in stage.trainable) - listed - sum(edges)
    head = (rank * spec.hidden_size, spec.vocab_size // ctx.workload.parallel.tp * rank)
    found = head if not ctx.full and stage.last and targets & HEAD_NAMES and rest >= sum(head) else ()
    rest -= sum(found)
    return (*found, rest) if rest > 0 else found


def _fsdp_sizes(ctx: TrainingContext, stage: StageView) -> tuple[int, int, int, int, int]:
    """(edge units gathered through the step, one layer unit, its unsharded gradients, the
    embedding's own unit, the tail unit), bytes."""
    if ctx.workload.parallel.shard not in _PARAM_SHARDED:
        return 0, 0, 0, 0, 0
    u = units(ctx, stage)
    return u.embedding + u.tail, u.layer, u.layer_grads, u.embedding, u.tail


def step_shape(ctx: TrainingContext, mem: StageMemory, targets: frozenset[str], *, layers: bool = True) -> StepShape:
    """The allocator requests of one stage's step (see the module docstring); ``layers=False``
    leaves the decoder layers' lists empty (the vocabulary-sized tensors alone)."""
    stage, parallel, spec = mem.stage, ctx.workload.parallel, ctx.spec
    d_param = ctx.shard_group if parallel.shard in _PARAM_SHARDED else 1
    kinds = _kinds(ctx, stage) if layers else []
    table = spec.vocab_size * spec.hidden_size // parallel.tp
    edge_params, layer_params, layer_trained = resident_weights(ctx, stage, targets, kinds, d_param)
    embedding, head, trained_edges = _trained_edges(ctx, stage)
    group = stage.trainable[0] if stage.trainable else None
    a = ctx.compute_bytes
    saved = saved_tensors(ctx, mem, targets) if layers else Saved(lists=[[]], index=(), recomputed=[])
    full_cast = ctx.autocast and ctx.full
    chain = score_chain(ctx, mem, targets) if layers else ()
    return StepShape(
        layers=stage.layers,
        edge_params=edge_params,
        layer_params=tuple(layer_params),
        layer_trained=tuple(layer_trained) or ((),),
        edge_trained=trained_edges,
        extra_trained=_extra_trained(ctx, stage, layer_trained, trained_edges, targets)
        if layers and d_param == 1
        else (),
        embedding_trained=embedding,
        head_trained=head,
        tied_grads=embedding and spec.tie_word_embeddings and stage.last and parallel.shard not in _PARAM_SHARDED,
        adapter_params=not ctx.full,
        param_bytes=int(group.param_bytes) if group is not None else ctx.param_bytes,
        grad_bytes=group.grad_bytes if group is not None else ctx.grad_bytes,
        state_bytes=group.state_bytes if group is not None else ctx.state_bytes,
        **_optimizer_fields(ctx),
        saved=tuple(tuple(each) for each in saved.lists),
        saved_kind=saved.index,
        adapter_sums=tuple(tuple(each) for each in saved.adapters),
        forward_scripts=tuple(saved.scripts),
        eager_chains=tuple(saved.chains),
        compute_bytes=a,
        adapter_bytes=2 if ctx.autocast or not ctx.profile.adapters_fp32 else 4,
        recomputed=tuple(saved.recomputed),
        casts=tuple(w * a for w in layer_trained[0] if w > spec.hidden_size) if full_cast and layers else (),
        casts_kept=ctx.workload.recompute is Recompute.NONE,
        head_cast=table * a if full_cast and stage.last else 0,
        forward_working=mem.forward_besides_scores_bytes if chain or any(saved.chains) else mem.forward_working_bytes,
        score_chain=chain,
        working=mem.working_bytes,
        hidden=ctx.tokens * spec.hidden_size * a,
        widths=tensor_widths(ctx) if layers else (),
        non_layer=mem.non_layer_bytes + mem.head_side_bytes,
        inputs=mem.inputs_bytes,
        dequant=mem.dequant_bytes,
        **_fsdp_fields(ctx, stage, kinds, layer_trained, table),
        loss_in_model=ctx.profile.loss_in_model,
        grads_sharded=ctx.shard_group if parallel.shard in _GRAD_SHARDED else 1,
        states_sharded=ctx.shard_group if parallel.shard in _STATE_SHARDED else 1,
        in_backward=ctx.in_backward_step,
        below_head=not only_the_head_trains(ctx, targets),
    )


def _fsdp_fields(
    ctx: TrainingContext, stage: StageView, kinds: list[LayerKind], layer_trained: list[tuple[int, ...]], table: int
) -> dict[str, Any]:
    """The :class:`StepShape` fields of parameter sharding: gathered units and, for FSDP2 (or
    FSDP1 split units), the copy-out parameters, unsharded gradients and their streams."""
    spec, parallel, a = ctx.spec, ctx.workload.parallel, ctx.compute_bytes
    gather_edges, gather_layer, gather_grads, gather_embedding, gather_tail = _fsdp_sizes(ctx, stage)
    copy_out = parallel.shard in (Shard.FSDP, Shard.HSDP) and (uses_fsdp2(ctx) or resolved_wrap(ctx) is FsdpWrap.SPLIT)
    return {
        "gather_edges": gather_edges,
        "gather_layer": gather_layer,
        "gather_layer_grads": gather_grads,
        "gather_embedding": gather_embedding if copy_out else 0,
        "gather_tail": gather_tail if copy_out else 0,
        "unsharded_layer": unsharded_params(ctx, stage, kinds, layer_trained, a) if copy_out else ((),),
        "unsharded_grads": (
            tuple(tuple(e * a for e in t) for t in layer_trained) if copy_out and layer_trained else ((),)
        ),
        "tail_tensors": (spec.hidden_size * a, table * a) if copy_out and gather_tail else (),
        "tail_norm": spec.hidden_size if copy_out and gather_tail and ctx.full else 0,
        "tied": copy_out and spec.tie_word_embeddings and stage.first and stage.last,
        "unsharded_bytes": a,
        "no_sync": copy_out and accumulates_unsharded(ctx),
        "gather_copy_out": copy_out,
        "reduce_bytes": 4 if ctx.profile.fsdp_reduce_fp32 else a,
        "grad_stream": Stream.ALL_REDUCE if parallel.shard is Shard.HSDP else Stream.REDUCE_SCATTER,
    }


def _optimizer_fields(ctx: TrainingContext) -> dict[str, Any]:
    """The optimizer's share of a :class:`StepShape`: moments per tensor and step temporaries (none on
    the GPU when the optimizer is offloaded: its state, master weights and step live in CPU memory)."""
    optimizer = optimizer_model(ctx.workload.optimizer)
    if ctx.workload.parallel.offload is not Offload.NONE:
        return {"moments": 0, "foreach": False, "per_tensor_copies": 0, "master_bytes": 0}
    return {
        "master_bytes": ctx.master_bytes,
        "moments": 0 if optimizer.paged else optimizer.moments,
        "foreach": ctx.optimizer_impl is OptimizerImpl.FOREACH and optimizer.temp_copies > 0 and optimizer.moments > 0,
        "per_tensor_copies": 2 if ctx.optimizer_impl is OptimizerImpl.PER_TENSOR and optimizer.temp_copies else 0,
    }
