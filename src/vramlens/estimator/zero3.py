"""DeepSpeed ZeRO-3's gathered parameters, instant by instant, from its parameter coordinator's rules.

ZeRO-3 does not gather whole layers as FSDP does: a hook on every submodule fetches that module's own
parameters before it runs (``PartitionedParameterCoordinator.fetch_sub_module``, deepspeed 0.19.8
``runtime/zero/partitioned_param_coordinator.py``) and releases them after (``release_sub_module``).
From the third step on (the first records the module trace, ``reset_step`` completes it) two rules
keep parameters gathered beyond their module:

* **prefetch up to ``stage3_max_live_parameters``** (``M``): after each fetch the coordinator
  prefetches the next parameters of the trace, at most ``stage3_prefetch_bucket_size`` per fetch and
  only while fewer than ``M`` elements are gathered (``max_params_to_prefetch = min(M - available,
  bucket)``, whole tensors, so the last one crosses ``M``). Every submodule's fetch (layers, attention
  and MLP blocks too) prefetches, so within a few layers ``M`` elements (at most one tensor more) are
  gathered whenever that many are still to be used in the step; the queue skips what is gathered
  already and marks it as fetched for its next use, so it is not released in between. A
  ``stage3_prefetch_bucket_size`` of 0 turns the prefetch off.
* **reuse distance** (``stage3_max_reuse_distance``, ``R``): a module's parameters are not released
  when the modules up to their next use in the trace hold fewer than ``R`` elements
  (``__params_to_release``). The trace is forward then backward, so after the forward a tensor of the
  layer with ``k`` layers after it and ``A`` elements after it in its own layer is next used after
  ``2 (A + k P + T)`` elements (``P`` a layer's, ``T`` the final norm's and head's): the last layers
  and the head stay gathered into the backward (:func:`reuse_kept`).

Tensors of at most ``stage3_param_persistence_threshold`` elements stay gathered for good
(``mark_persistent_parameters``). At a layer's instant the tensor being computed is gathered beside the
kept ones. With HF's example configs (``M = R = 1e9``) a model of fewer than 1e9 parameters is thus
gathered whole from the second layer's forward into the backward (a tracked CPU run of DeepSpeed's own
step: every parameter gathered at the start of backward; ``tests/estimator/test_deepspeed.py``).

The gradients: autograd makes each full gradient, a hook copies it into the contiguous reduce bucket
(``reduce_bucket_size``, :mod:`vramlens.estimator.offload`) when it fits; a larger one stays in its own
tensor until the next gradient's hook reduces it (``__add_grad_to_ipg_bucket``,
``reduce_independent_p_g_buckets_and_remove_grads``), so a layer's backward holds the gradient being
made and, when the largest tensor exceeds the bucket, one waiting. The gradient partitions are one
buffer allocated at initialization (``grad_partitions_flat_buffer``, stage3.py) and alive through the
whole step (:func:`grad_partitions_whole_step`).
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.estimator.layout import StageView
from vramlens.model.modules import layer_linears
from vramlens.model.params import layer_parameters, norm_parameters
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.zero import ZeroSettings
from vramlens.workload.options import Offload, Recompute, Shard

__all__ = [
    "Gathered",
    "Kept",
    "Zero3Model",
    "gathered_elements",
    "grad_partitions_whole_step",
    "inflight_gradients",
    "reuse_kept",
    "step_sub_group",
    "zero3_model",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class Zero3Model:
    """One stage's parameters as ZeRO-3's coordinator sees them, in elements (``numel``)."""

    layer: tuple[int, ...]
    """One decoder layer's tensors in forward order (norms first, then the linears, then the rest)."""
    layers: int
    embedding: int
    """The input embedding (0 when tied to the head or not on the stage)."""
    head: int
    """The LM head, or the tied table (0 when not on the stage)."""
    tied: bool
    """The head's table is the input embedding's (used again in the embedding's backward, last)."""
    final_norm: int
    persistence_threshold: int
    layers_elements: int = 0
    """Every element of the stage's layers (layers of several kinds differ from ``layer``, the first
    kind's); 0: ``layers`` times ``layer``."""
    recomputed: bool = False
    """Every layer is checkpointed (transformers' non-reentrant ``torch.utils.checkpoint``): in the
    backward a layer's last module is fetched first (its pre-backward hook), then the whole layer
    again for the recomputed forward, then the rest of its backward."""

    def gathered(self, tensors: tuple[int, ...]) -> int:
        """Elements of ``tensors`` that are gathered on demand (above the persistence threshold)."""
        return sum(t for t in tensors if t > self.persistence_threshold)

    @property
    def persistent(self) -> int:
        """Elements gathered for good: every tensor of at most the threshold."""
        small = self.persistence_threshold
        edges = (self.embedding, self.head, self.final_norm)
        return sum(t for t in self.layer if t <= small) * self.layers + sum(t for t in edges if t <= small)

    @property
    def largest(self) -> int:
        """The largest gathered layer tensor (the one being computed; the prefetch's overshoot)."""
        return max((t for t in self.layer if t > self.persistence_threshold), default=0)

    @property
    def total(self) -> int:
        """Every gathered-on-demand element of the stage."""
        small = sum(t for t in self.layer if t <= self.persistence_threshold) * self.layers
        layers = (self.layers_elements or sum(self.layer) * self.layers) - small
        return layers + self.gathered((self.embedding, self.head, self.final_norm))


def zero3_model(ctx: TrainingContext, stage: StageView, settings: ZeroSettings) -> Zero3Model:
    """The stage's tensors: each linear (and bias) and norm of the first layer kind, the rest of the
    layer's elements (routed experts, mixers' vectors) as two tensors and, with LoRA, a layer's
    adapters as one (their elements from the layout); the vocabulary tables ``V x h``."""
    spec, tp, layers = ctx.spec, ctx.workload.parallel.tp, stage.layers
    lora = sum(g.elements for g in stage.trainable if g.name == "LoRA adapters") // layers if layers else 0
    tensors = [*_layer_tensors(ctx, stage), lora] if layers else []
    table = spec.vocab_size * spec.hidden_size // tp
    tied = spec.tie_word_embeddings and stage.first and stage.last
    return Zero3Model(
        layer=tuple(t for t in tensors if t > 0),
        layers=stage.layers,
        embedding=table if stage.first and not tied else 0,
        head=table if stage.last else 0,
        tied=tied,
        final_norm=norm_parameters(spec.norm, spec.hidden_size) if stage.last else 0,
        persistence_threshold=settings.persistence_threshold,
        layers_elements=_layers_elements(ctx, stage) + lora * layers if layers else 0,
        recomputed=ctx.workload.recompute is Recompute.FULL and ctx.workload.recompute_every == 1,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Kept:
    """Elements the reuse distance keeps gathered at the end of forward (:func:`reuse_kept`)."""

    total: int
    last_layer: int
    """Of them the last layer's (backward reaches it first)."""
    first_layer: int
    """Of them the first layer's (backward reaches it last)."""
    embedding: int


def _layers_elements(ctx: TrainingContext, stage: StageView) -> int:
    """Every parameter element of the stage's layers, kind by kind (LoRA adapters apart)."""
    spec, generic = ctx.spec, ctx.spec.generic
    if generic is not None:
        return sum(generic.kinds[generic.layer_kinds[i]].elements for i in stage.layer_range)
    return sum(layer_parameters(spec, spec.layers[i].kind) for i in stage.layer_range) // ctx.workload.parallel.tp


def _layer_tensors(ctx: TrainingContext, stage: StageView) -> list[int]:
    """One layer's tensors in forward order: its norms, linears (and biases) and the rest of its
    elements as two tensors; for a model traced from its code (no native family) the rest (norms,
    convolutions, vectors) as one tensor first, then its linears and fused expert tensors."""
    spec, tp = ctx.spec, ctx.workload.parallel.tp
    generic = spec.generic
    if generic is not None:
        kind = generic.kinds[generic.layer_kinds[stage.layer_range[0]]]
        listed = [s.in_features * s.out_features + (s.out_features if s.bias else 0) for s in kind.linears]
        listed += [expert.elements for expert in kind.experts]
        return [max(0, stage.layer_elements - sum(listed)), *listed]
    tensors = [norm_parameters(spec.norm, spec.hidden_size)] * spec.norms_per_layer
    for shape in layer_linears(spec, spec.layers[stage.layer_range[0]].kind):
        tensors += [shape.in_features * shape.out_features // tp] + ([shape.out_features // tp] if shape.bias else [])
    rest = max(0, stage.layer_elements - sum(tensors))
    return [*tensors, 2 * rest // 3, rest - 2 * rest // 3]


def reuse_kept(model: Zero3Model, max_reuse: int) -> Kept:
    """What the reuse distance ``max_reuse`` (``R``) keeps gathered at the end of forward. Tensor ``j`` of
    the layer with ``k`` layers after it is next used after ``2 (A_j + k P + T)`` elements, ``A_j`` the
    layer's elements after it, ``P`` a layer's, ``T`` the final norm and head; with every layer
    recomputed after ``3 k P + 2 T`` for the layer's last tensor (fetched first in its backward) and
    ``3 k P + 2 T + P + e_last - e_j`` for the others (in the recomputed forward); kept when that is
    below ``R``. The head (used again at once) is kept when ``R > 0``, the untied embedding when
    ``2 (L P + T) < R`` (``3 L P + 2 T`` recomputed). Every tensor counts in the distance, persistent
    or not."""
    layer_total, tail, last = sum(model.layer), model.final_norm + model.head, len(model.layer) - 1
    per_layer = (3 if model.recomputed else 2) * layer_total
    kept = first = last_layer = 0
    after = layer_total
    for index, tensor in enumerate(model.layer):
        after -= tensor
        if tensor <= model.persistence_threshold:
            continue
        if not model.recomputed:
            distance = 2 * (after + tail)
        else:
            distance = 2 * tail + (0 if index == last else layer_total + model.layer[last] - tensor)
        room = max_reuse - distance
        layers = 0 if room <= 0 else min(model.layers, -(-room // per_layer))
        kept += layers * tensor
        last_layer += tensor if layers else 0
        first += tensor if layers >= model.layers else 0
    head = model.gathered((model.head,)) if max_reuse > 0 else 0
    embedding_distance = model.layers * per_layer + 2 * tail
    embedding = model.gathered((model.embedding,)) if embedding_distance < max_reuse else 0
    return Kept(total=kept + head + embedding, last_layer=last_layer, first_layer=first, embedding=embedding)


@dataclass(frozen=True, kw_only=True, slots=True)
class Gathered:
    """Gathered parameter elements at each instant of a step (the persistent ones included)."""

    forward_layer: int
    """Inside the last layer's forward."""
    loss: int
    """At the loss and the start of backward (nothing is released in between)."""
    first_layers: int
    """Inside the last layer's backward (the head released)."""
    last_layer: int
    """Inside the first layer's backward (only it and the embedding still to be used)."""
    end: int
    """Inside the embedding's backward."""


def gathered_elements(model: Zero3Model, settings: ZeroSettings) -> Gathered:
    """Elements gathered at each instant: the persistent tensors and, of what the step still uses,
    at most ``max(kept and the tensors being computed, M + one tensor)`` (the second when the prefetch
    is on; :func:`reuse_kept` for the kept ones; computed: the largest layer tensor, or a recomputed
    layer whole in its backward, its tensors used again within about two layers' elements)."""
    kept = reuse_kept(model, settings.max_reuse)
    p, layer = model.largest, model.gathered(model.layer)
    backward = layer if model.recomputed and 2 * sum(model.layer) < settings.max_reuse else p
    window = settings.max_live + p if settings.prefetch_bucket > 0 and settings.max_live > 0 else 0
    head = model.gathered((model.head,))
    head_kept = head if settings.max_reuse > 0 else 0
    table = model.gathered((model.embedding,)) or (head if model.tied else 0)

    def at(still_used: int, kept_now: int, computing: int, of_it_kept: int) -> int:
        both = kept_now + computing - min(computing, of_it_kept)  # what is computed may be kept already
        return model.persistent + min(still_used, max(both, window))

    return Gathered(
        forward_layer=at(model.total, kept.total - head_kept, p, kept.last_layer),
        loss=at(model.total, kept.total, 0, 0),
        first_layers=at(model.total - (0 if model.tied else head), kept.total - head_kept, backward, kept.last_layer),
        last_layer=at(layer + table, kept.first_layer + kept.embedding, backward, kept.first_layer),
        end=at(table, table, 0, 0),
    )


def inflight_gradients(model: Zero3Model, trained: int, *, edges_trained: bool, bucket: int) -> tuple[int, int, int]:
    """Full gradients alive at once (elements) in a layer's backward, in the last layer's, and in the
    embedding's: the one autograd makes (``trained``: the largest trained layer tensor) and, when the
    previous one exceeded the reduce ``bucket``, that one waiting (after the head's backward the
    head's, when the vocabulary tables are trained)."""
    waiting = trained if trained > bucket else 0
    layer = trained + waiting
    head = model.head if edges_trained and model.head > bucket else 0
    table = (model.embedding or model.head) if edges_trained else 0
    return layer, max(layer, head + trained), table + waiting


def step_sub_group(partition: int, largest: int, sub_group: int) -> int:
    """Elements of the largest optimizer sub group of a rank's ``partition``: ZeRO-3 adds parameters'
    partitions to a sub group until it holds ``sub_group_size`` (``_create_fp16_sub_groups``), so at
    most that plus one (``largest``) partition. Each sub group's gradients are flattened in their own
    dtype, cast to fp32 (both alive in the cast) and freed after its step
    (``_prepare_fp32_grad_for_sub_group``, ``_release_sub_group``)."""
    return min(partition, sub_group + largest)


def grad_partitions_whole_step(ctx: TrainingContext) -> bool:
    """ZeRO-3 keeps its gradient partitions in one buffer allocated at initialization
    (``grad_partitions_flat_buffer``), on the GPU unless the optimizer is offloaded: alive from the
    forward on, not made in the backward."""
    return ctx.workload.parallel.shard is Shard.ZERO3 and ctx.workload.parallel.offload is Offload.NONE
