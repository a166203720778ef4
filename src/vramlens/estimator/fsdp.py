"""Unsharded parameters, FSDP's buffers and unsharded gradients at each instant of a step.

With sharded parameters (``shard: fsdp | hsdp``, or ``offload: optimizer+params``; DeepSpeed
ZeRO-3 gathers by its own coordinator's rules, :mod:`vramlens.estimator.zero3`) a rank
all-gathers the units it computes and keeps buffers for overlap; which of them are alive
depends on the instant, so :class:`Unsharded` holds one value per instant and
:mod:`vramlens.estimator.training` reads the one of each phase. Two wrappings
(``fsdp_wrap``, :class:`~vramlens.workload.options.FsdpWrap`):

* ``root``: decoder layers are units; the embedding, final norm and head stay in the root,
  all-gathered from forward to backward. Counted as the root, two layers in flight and one
  layer's unsharded gradients and reduce-scatter input, at every instant. Also the frameworks
  that do not say otherwise.
* ``split``: the embedding, each layer, and the tail (final norm + head, + the embedding when
  tied) are units; only the tail stays gathered after forward (accelerate 1.15
  ``fsdp2_prepare_model``; torchtitan ``apply_fsdp`` since 83e694105, 2025-07-28). FSDP2 in
  torch 2.13 (``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``, ``_fsdp_state.py``):
  ``wait_for_unshard`` keeps a forward all-gather's flat output until the next unit's
  copy-out, and the root's ``_post_forward`` frees the last one; ``pre_backward`` prefetches
  the next unit's all-gather; ``post_backward`` keeps a unit's reduce-scatter input until the
  next unit's (``reduce_scatter_max_input_buffers = 1``).
* ``root`` under FSDP2 (litgpt's LoRA, ``FrameworkProfile.fsdp2_lora``): the same mechanics, the root
  unit kept gathered to the end of backward, each layer resharded after forward (:func:`fsdp2_root_unsharded`).

A unit's bytes are its elements in the compute dtype (FSDP2 pads each rank's rows to
``ceil(dim0 / N)``: not counted). Checked against FSDP2 on fake ranks
(``tests/simulator/test_distributed.py``) and by hand (``tests/estimator/test_fsdp.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Protocol

from vramlens.categories import Category
from vramlens.estimator.layout import StageView
from vramlens.resolve.context import TrainingContext
from vramlens.workload.options import Framework, FsdpWrap, Offload, Shard

__all__ = [
    "Units",
    "Unsharded",
    "casts_outputs",
    "fsdp2_root_kept",
    "fsdp2_root_unsharded",
    "fsdp_memory",
    "resolved_wrap",
    "root_unsharded",
    "split_unsharded",
    "units",
    "uses_fsdp2",
]

_PARAM_SHARDED = {Shard.ZERO3, Shard.FSDP, Shard.HSDP}
_WHOLE_STEP = "whole step"
#: Frameworks whose trainer skips the gradient reduce-scatter on all but the last micro-step,
#: so unsharded gradients of every unit accumulate (in the reduce dtype under FSDP2).
_NO_SYNC = {
    Framework.HF: "transformers Trainer: accelerator.no_sync(model) on all but the last micro-batch "
    "(FSDP2: set_requires_gradient_sync(False); FSDPParam.to_accumulated_grad_if_needed)",
    Framework.TRL: "TRL's trainers run transformers' Trainer loop: accelerator.no_sync(model) on all but the last "
    "micro-batch",
}

#: What each wrapping means, for the report's assumptions.
_WRAPS = {
    FsdpWrap.SPLIT: "embedding and final norm + head are units of their own, as accelerate's FSDP2 "
    "(transformers 5 Trainer) and torchtitan since 2025-07-28; fsdp_wrap: root for FSDP1",
    FsdpWrap.ROOT: "embedding and head stay gathered in the root unit, as FSDP1",
}

_FSDP2_ROOT = "FSDP2 fully_shard per layer and on the root, kept gathered to the end of backward (litgpt's LoRA)"


class AddTerm(Protocol):
    """Records a report term (``StageMemory.add``): its bytes."""

    def __call__(
        self, name: str, category: Category, value: float, formula: Callable[[], str] | str, *, alive: str = ""
    ) -> int: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Unsharded:
    """Bytes alive at each instant of one step on one rank (all 0 without parameter sharding).
    Every field but ``accumulated_grads`` is temporary memory (gathered parameters and buffers)."""

    forward_layer: int = 0
    """During a decoder layer's forward."""
    loss: int = 0
    """At the loss, the end of forward."""
    backward_start: int = 0
    """At the start of backward (the loss gradient)."""
    first_layers: int = 0
    """During the backward of the decoder layers backward reaches first."""
    last_layer: int = 0
    """During the first decoder layer's backward (the last layer backward reaches)."""
    end: int = 0
    """During the embedding's backward, at the end of backward."""
    accumulated_grads: int = 0
    """Unsharded gradients kept across micro-steps without gradient sync (category gradients):
    alive through forward and the start of backward."""
    how: str = ""
    """What is gathered (the wrapping and its units), for the terms of each instant."""

    @classmethod
    def constant(cls, amount: int, *, how: str = "") -> Unsharded:
        """The same bytes at every instant (a stage kept unsharded for the whole step)."""
        return cls(**{f.name: amount for f in fields(cls) if f.name not in ("accumulated_grads", "how")}, how=how)


@dataclass(frozen=True, kw_only=True, slots=True)
class Units:
    """One rank's FSDP units all-gathered (bytes in the compute dtype), their unsharded
    gradients (compute dtype) and reduce-scatter inputs (reduce dtype); 0 for what is frozen
    or not on the stage."""

    layer: int
    layer_grads: int
    layer_reduce: int
    embedding: int
    """The input embedding's own unit (0 when tied: it is then part of the tail)."""
    embedding_grads: int
    embedding_reduce: int
    tail: int
    """Final norm + LM head (+ the tied embedding)."""
    tail_grads: int
    tail_reduce: int
    tied: bool


def units(ctx: TrainingContext, stage: StageView) -> Units:
    """The units of ``stage`` (elements from the layout, ``V x h / tp`` for the vocabulary
    matrices). Compute dtype ``a``: FSDP's ``param_dtype`` (bf16 under mixed precision);
    reduce dtype: fp32 where the profile reduces in fp32 (torchtitan), else ``a``
    (accelerate sets ``reduce_dtype = param_dtype``). LoRA adapters count in the layer unit."""
    spec, a = ctx.spec, ctx.compute_bytes
    r = 4 if ctx.profile.fsdp_reduce_fp32 else a
    table = spec.vocab_size * spec.hidden_size // ctx.workload.parallel.tp
    tied = spec.tie_word_embeddings and stage.first and stage.last
    adapters = sum(g.elements for g in stage.trainable if g.name == "LoRA adapters")
    trained_layer = stage.layer_elements if ctx.full else adapters // max(stage.layers, 1)
    layer = stage.layer_elements + (0 if ctx.full else trained_layer)
    embedding = table if stage.first and not tied else 0
    tail = table + spec.hidden_size if stage.last else 0
    edge = 1 if ctx.full else 0
    return Units(
        layer=layer * a,
        layer_grads=trained_layer * a,
        layer_reduce=trained_layer * r,
        embedding=embedding * a,
        embedding_grads=embedding * a * edge,
        embedding_reduce=embedding * r * edge,
        tail=tail * a,
        tail_grads=tail * a * edge,
        tail_reduce=tail * r * edge,
        tied=tied,
    )


def root_unsharded(ctx: TrainingContext, stage: StageView) -> Unsharded:
    """``root`` wrapping: the root unit (embedding, head; FSDP1's root is not resharded after
    forward) and two layers in flight at every instant; in backward also one layer's unsharded
    gradients and reduce-scatter input, ``layer x (a + grad bytes)`` for full training."""
    spec, a = ctx.spec, ctx.compute_bytes
    table = spec.vocab_size * spec.hidden_size // ctx.workload.parallel.tp
    embedding = table if stage.first else 0
    head = table if stage.last and not (spec.tie_word_embeddings and stage.first) else 0
    gathered = (2 * stage.layer_elements + embedding + head) * a
    backward = gathered + (stage.layer_elements * (a + ctx.grad_bytes) if ctx.full else 0)
    return Unsharded(
        forward_layer=gathered,
        loss=gathered,
        backward_start=backward,
        first_layers=backward,
        last_layer=backward,
        end=backward,
    )


def split_unsharded(u: Units, *, loss_in_model: bool) -> Unsharded:
    """``split`` wrapping (FSDP2), instant by instant:

    * a layer's forward: its parameters and its all-gather output (``2 x layer``), beside the
      tied tail, gathered since the embedding's forward and kept (``reshard_after_forward=False``);
    * the loss: the tail, plus the last forward all-gather output when the loss runs before
      the root's post-forward (HF: inside the model) - the tail's own, or when tied (already
      gathered) the last layer's;
    * backward start: the tail;
    * a layer's backward: its parameters, the next unit prefetched, its unsharded gradients and
      the previous unit's reduce-scatter input (the head's for the first layer reached); when
      tied, also the tail and its gradient, kept until the embedding's backward;
    * the first layer's backward: the embedding prefetched instead of the next layer;
    * the embedding's backward: two copies of it (parameters beside the all-gather output, then
      the gradient, then gradient and reduce-scatter input), or when tied the tail with the
      head's gradient, the embedding's and their sum; plus the first layer's reduce-scatter input.
    """
    layer = 2 * u.layer + u.layer_grads
    if u.tied:
        kept = u.tail + u.tail_grads
        steady = kept + layer + u.layer_reduce
        return Unsharded(
            forward_layer=2 * u.layer + u.tail,
            loss=u.tail + (u.layer if loss_in_model else 0),
            backward_start=u.tail,
            first_layers=steady,
            last_layer=steady,
            end=u.tail + 3 * u.tail_grads + u.layer_reduce,
        )
    embedding = max(2 * u.embedding, u.embedding + u.embedding_grads, u.embedding_grads + u.embedding_reduce)
    return Unsharded(
        forward_layer=2 * u.layer,
        loss=u.tail * (2 if loss_in_model else 1),
        backward_start=u.tail,
        first_layers=layer + max(u.tail_reduce, u.layer_reduce),
        last_layer=u.layer + max(u.embedding, u.layer) + u.layer_grads + u.layer_reduce,
        end=embedding + u.layer_reduce,
    )


def fsdp2_root_unsharded(u: Units, *, loss_in_model: bool) -> Unsharded:
    """``root`` wrapping under FSDP2, the root left to ``fully_shard``'s default: ``fully_shard`` on
    every decoder layer, then on the model (litgpt ``finetune/lora.py`` ``parallelize_fn``). With
    ``reshard_after_forward`` not given, FSDP2 keeps the root unit ``R`` (embedding, final norm, head)
    gathered after forward (``FSDPState._lazy_init``: ``post_forward_mesh_info = None``) until its
    post-backward at the end of backward; each layer reshards after its forward. Instant by instant
    (torch 2.13 ``_fsdp_param_group.py``, ``_fsdp_state.py``):

    * a layer's forward: ``R``, the layer's parameters and its all-gather output (``wait_for_unshard``
      keeps it until the next unit's copy-out);
    * the loss: ``R``, plus the last layer's all-gather output when the loss runs before the root's
      ``_post_forward`` (inside the model);
    * backward start: ``R`` and the head's unsharded gradient (when it trains), which stays until the
      root's post-backward;
    * a layer's backward: its parameters, the next layer's all-gather prefetched
      (``_backward_prefetch``), its unsharded gradients and the previous layer's reduce-scatter input;
    * the first layer's backward: nothing to prefetch (the root is still gathered);
    * the end: the root's unsharded gradients and its reduce-scatter input, or the first layer's.

    Checked with two tracked CPU processes over gloo (tests/estimator/test_litgpt.py)."""
    root = u.embedding + u.tail
    kept = root + u.tail_grads
    layer = u.layer + u.layer_grads + u.layer_reduce
    return Unsharded(
        forward_layer=root + 2 * u.layer,
        loss=root + (u.layer if loss_in_model else 0),
        backward_start=kept,
        first_layers=kept + u.layer + layer,
        last_layer=kept + layer,
        end=kept + u.embedding_grads + max(u.layer_reduce, u.tail_reduce + u.embedding_reduce),
    )


def fsdp2_root_kept(ctx: TrainingContext) -> bool:
    """The ``root`` wrapping runs as FSDP2 with the root kept gathered (:func:`fsdp2_root_unsharded`):
    a LoRA run of a framework whose LoRA script shards so (``FrameworkProfile.fsdp2_lora``)."""
    if ctx.workload.parallel.shard not in (Shard.FSDP, Shard.HSDP) or resolved_wrap(ctx) is not FsdpWrap.ROOT:
        return False
    return ctx.profile.fsdp2_lora and not ctx.full


def uses_fsdp2(ctx: TrainingContext) -> bool:
    """The framework shards with FSDP2 (``fully_shard``) whatever the wrapping (``FrameworkProfile.fsdp2``),
    or does in this run (:func:`fsdp2_root_kept`)."""
    return ctx.profile.fsdp2 or fsdp2_root_kept(ctx)


def resolved_wrap(ctx: TrainingContext) -> FsdpWrap:
    """The wrapping that applies: the workload's ``fsdp_wrap``, else the framework's for FSDP
    and HSDP; ``root`` for the rest (ZeRO-3's gathered parameters are not FSDP units:
    :mod:`vramlens.estimator.zero3`)."""
    if ctx.workload.parallel.shard not in (Shard.FSDP, Shard.HSDP):
        return FsdpWrap.ROOT
    if ctx.workload.fsdp_wrap is not FsdpWrap.AUTO:
        return ctx.workload.fsdp_wrap
    return ctx.profile.fsdp_wrap


def casts_outputs(ctx: TrainingContext) -> bool:
    """FSDP2's root casts the model's outputs to the half dtype after accelerate has converted
    them to fp32 (``MixedPrecisionPolicy(output_dtype=half)``, accelerate
    ``FullyShardedDataParallelPlugin.set_mixed_precision``; its hooks run around the wrapped
    ``forward``), so the logits the loop keeps are half precision: under mixed precision with the
    split wrapping of a framework that computes the loss in the model (HF)."""
    split = resolved_wrap(ctx) is FsdpWrap.SPLIT and ctx.workload.parallel.shard in (Shard.FSDP, Shard.HSDP)
    return split and ctx.workload.precision.mixed and ctx.profile.loss_in_model


def accumulates_unsharded(ctx: TrainingContext) -> bool:
    """The framework's trainer accumulates micro-steps without gradient sync (``_NO_SYNC``) on
    FSDP/HSDP, keeping every unsharded gradient until the last micro-step."""
    parallel = ctx.workload.parallel
    if ctx.profile.name not in _NO_SYNC or parallel.shard not in (Shard.FSDP, Shard.HSDP):
        return False
    return ctx.workload.grad_accum > 1 and not ctx.in_backward_step


def _accumulated_grads(ctx: TrainingContext, stage: StageView) -> int:
    """Unsharded gradients of every trainable parameter in the reduce dtype, when the framework's
    trainer accumulates micro-steps without gradient sync (``_NO_SYNC``); else 0."""
    if not accumulates_unsharded(ctx):
        return 0
    r = 4 if ctx.profile.fsdp_reduce_fp32 else ctx.compute_bytes
    return stage.trainable_elements * r


def fsdp_memory(ctx: TrainingContext, stage: StageView, add: AddTerm, notes: list[str]) -> Unsharded:
    """What parameter sharding keeps unsharded on ``stage`` (not for FSDP under pipeline
    parallelism, see ``quantities._pipeline_unsharded``), with the report's terms through ``add``
    and the wrapping ``auto`` chose in ``notes``."""
    parallel = ctx.workload.parallel
    if parallel.shard not in _PARAM_SHARDED and parallel.offload is not Offload.OPTIMIZER_PARAMS:
        return Unsharded()
    wrap = resolved_wrap(ctx)
    if parallel.shard in (Shard.FSDP, Shard.HSDP) and ctx.workload.fsdp_wrap is FsdpWrap.AUTO:
        how = _FSDP2_ROOT if fsdp2_root_kept(ctx) else _WRAPS[wrap]
        notes.append(f"fsdp_wrap auto: {wrap} ({ctx.profile.name} default; {how})")
    if fsdp2_root_kept(ctx):
        u = units(ctx, stage)
        found = fsdp2_root_unsharded(u, loss_in_model=ctx.profile.loss_in_model)
        how = (
            f"root wrapping under FSDP2: root unit {u.embedding + u.tail:,} B kept gathered, layer unit {u.layer:,} B, "
            f"its gradients {u.layer_grads:,} B and reduce-scatter input {u.layer_reduce:,} B"
        )
        add(
            "unsharded parameters (FSDP2: the root unit kept gathered; the layer and the next one's all-gather "
            "inside a layer's backward)",
            Category.TEMPORARY,
            max(found.first_layers, found.forward_layer),
            lambda: (
                f"root unit {u.embedding + u.tail:,} B + 2 x {u.layer:,} B layer + {u.layer_grads + u.layer_reduce:,} B "
                "gradients and reduce-scatter input"
            ),
            alive="inside a layer's forward or backward",
        )
    elif wrap is FsdpWrap.ROOT:
        found = root_unsharded(ctx, stage)
        how = f"root wrapping: (2 x {stage.layer_elements:,} + vocabulary matrices) x {ctx.compute_bytes} B" + (
            f"; in backward + one layer's gradients x ({ctx.compute_bytes} + {ctx.grad_bytes}) B" if ctx.full else ""
        )
        add(
            "unsharded parameters (two layers in flight + the root unit: embedding, head)",
            Category.TEMPORARY,
            found.loss,
            lambda: f"(2 x {stage.layer_elements:,} + vocabulary matrices) x {ctx.compute_bytes} B",
            alive=_WHOLE_STEP,
        )
    else:
        u = units(ctx, stage)
        found = split_unsharded(u, loss_in_model=ctx.profile.loss_in_model)
        how = (
            f"split wrapping (FSDP2): layer unit {u.layer:,} B, its gradients {u.layer_grads:,} B and reduce-scatter "
            f"input {u.layer_reduce:,} B, embedding {u.embedding:,} B, head unit {u.tail:,} B"
        )
        _split_terms(u, found, add)
    accumulated = _accumulated_grads(ctx, stage)
    if accumulated:
        add(
            "unsharded accumulated gradients (no gradient sync between micro-steps)",
            Category.GRADIENTS,
            accumulated,
            _NO_SYNC[ctx.profile.name],
            alive="from the first micro-step's backward to the last one's",
        )
    kept = {f.name: getattr(found, f.name) for f in fields(found)}
    return Unsharded(**kept | {"accumulated_grads": accumulated, "how": how})


def _split_terms(u: Units, found: Unsharded, add: AddTerm) -> None:
    """The report's terms of the split wrapping (each one instant's bytes)."""
    add(
        "unsharded parameters at the loss (FSDP2: the head unit, kept into backward, and the last all-gather output)",
        Category.TEMPORARY,
        found.loss,
        lambda: (
            f"head unit {u.tail:,} B{' (with the tied embedding)' if u.tied else ''}, "
            f"+ {found.loss - u.tail:,} B all-gather output until the root's post-forward"
        ),
        alive="at the loss",
    )
    add(
        "unsharded parameters in a layer's backward (FSDP2: the layer, the next unit prefetched, gradients, "
        "reduce-scatter input)",
        Category.TEMPORARY,
        max(found.first_layers, found.last_layer),
        lambda: (
            f"2 x {u.layer:,} B layer + {u.layer_grads:,} B gradients + the previous unit's reduce-scatter "
            f"input (head {u.tail_reduce:,} B, layer {u.layer_reduce:,} B); first layer: the embedding "
            f"{u.embedding:,} B prefetched"
        ),
        alive="inside a layer's backward",
    )
    add(
        "unsharded parameters in the embedding's backward (FSDP2)",
        Category.TEMPORARY,
        found.end,
        lambda: f"{found.end - u.layer_reduce:,} B embedding copies + {u.layer_reduce:,} B reduce-scatter input",
        alive="inside the embedding's backward",
    )
