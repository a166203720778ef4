"""Reserved memory from the allocator: the step's requests and the caching-allocator model.

``reserved - allocated`` at the peak (the allocator's slack) is memory the caching allocator
holds in cached blocks that the next requests cannot use: a freed block smaller than the next
request (the logits freed before a larger gradient), a vocabulary-sized block split by the next
step's activations so that the same request needs a new segment, 20 MiB segments shared by
1-10 MiB tensors. It comes from :mod:`vramlens.allocator` (the model of PyTorch's
``CUDACachingAllocator.cpp`` the simulator replays its recorded timelines through), under the
workload's ``alloc_conf``:

* with parameters sharded by FSDP2, and on one GPU unless the workload says ``reserved_replay: false``
  (3-70 ms an estimate by the number of layers, 20-90x the closed form: ``benchmarks/replay_speed.py``;
  the default since the H200 battery, ``validation/measured/2026-11-27-h200``, found it within 1.2% of
  ``max_memory_reserved`` on every unquantized training run where the closed form was up to 13% low
  under checkpointing), the **whole step is replayed**, every layer:
  :mod:`vramlens.estimator.step_pattern` writes the requests the estimator's terms imply in code
  order (:mod:`vramlens.estimator.step_shape`, :mod:`vramlens.estimator.step_layers`) straight
  into the allocator model
  (:func:`~vramlens.allocator.replaying.replaying_pattern`, the peaks of the full replay to the byte),
  memoized on the frozen :class:`~vramlens.estimator.step_shape.StepShape`; checked against the simulator's
  replay of the real code (``tests/simulator/test_agreement.py``, ``test_distributed.py``);
* otherwise (one GPU with ``reserved_replay: false``, as the planner's search prunes; DDP, ZeRO, FSDP1
  always) two parts: the vocabulary-sized
  tensors (logits and loss, the head's weight copy, the embedding's and head's gradients and
  state) replayed (the pattern with no decoder layer), and the decoder layers' slack as a
  **closed form**, ``LAYER_SLACK_FRACTION`` of the activation and of the parameter-sized memory
  they churn in a step, fitted to replays of the full per-layer pattern
  (``benchmarks/allocator_fit.py``); the layers' gradients also reuse the vocabulary blocks left
  stranded, up to their bytes.

:func:`replayed_slack` replays any pattern (every layer) and is the reference the closed form is
checked against (``tests/estimator/test_reserved.py``). The reserved margin (``safe``) stays
``LAYER_SLACK_SPREAD`` x the churn in every case.
"""

from __future__ import annotations

import dataclasses
import operator
from functools import lru_cache
from typing import Any, Final

from vramlens._records import maker
from vramlens.allocator import AllocatorSettings
from vramlens.allocator.replaying import replaying_pattern
from vramlens.estimator.lora_head import training_lora_head, with_head_script
from vramlens.estimator.loss_outputs import fp32_model_outputs, loss_chunks, model_logits_bytes
from vramlens.estimator.loss_pattern import LossScript, loss_script
from vramlens.estimator.quantities import StageMemory
from vramlens.estimator.step_pattern import step_pattern
from vramlens.estimator.step_shape import StepShape, step_shape
from vramlens.estimator.trl_head import fused_head, fused_head_script
from vramlens.resolve.context import TrainingContext
from vramlens.workload.options import Framework, Offload, Shard

__all__ = [
    "KV_GROWTH_FRACTION",
    "allocator_settings",
    "generation_slack",
    "generation_spread",
    "KV_GROWTH_SPREAD",
    "LAYER_SLACK_FRACTION",
    "LAYER_SLACK_SPREAD",
    "TrainingSlack",
    "layer_churn",
    "replayed_slack",
    "replays_whole_step",
    "training_loss_script",
    "training_slack",
]

#: Per-layer slack as fractions of the churning memory (saved activations, backward working set
#: and recomputed layer, parameter-sized tensors: see :func:`layer_churn`), by (expandable
#: segments, parameters sharded by FSDP/ZeRO-3): non-negative least squares over the replays of
#: ``benchmarks/allocator_fit.py`` (480 sampled catalog workloads on one GPU and on 8 with DDP,
#: ZeRO-2 or FSDP, with and without recompute; seed 0). The sharded rows were refitted when the
#: pattern gained FSDP's streams (all-gather outputs and sharded gradients in pools of their own,
#: :mod:`vramlens.allocator.streams`): before, (0.020, 0.230, 0.056) and (0.004, 0.047, 0.018).
LAYER_SLACK_FRACTION: Final = {
    (False, False): (0.056, 0.788, 0.097),
    (False, True): (0.033, 0.247, 0.213),
    (True, False): (0.008, 0.234, 0.028),
    (True, True): (0.017, 0.125, 0.169),
}
#: Upper quartile minus median of the replays' residual over the churn, by the same keys: the
#: reserved margin (:mod:`vramlens.estimator.margins`, "modelled allocator").
LAYER_SLACK_SPREAD: Final = {
    (False, False): 0.078,
    (False, True): 0.048,
    (True, False): 0.014,
    (True, True): 0.032,
}
#: Slack / final KV cache of transformers' DynamicCache decode (each step ``torch.cat`` makes
#: every layer's keys and values one token longer), by expandable segments: medians of the
#: decode replays of ``benchmarks/allocator_fit.py``.
KV_GROWTH_FRACTION: Final = {False: 0.31, True: 0.057}
#: Upper quartile minus median of the decode replays.
KV_GROWTH_SPREAD: Final = {False: 0.13, True: 0.13}


@lru_cache(maxsize=256)
def allocator_settings(alloc_conf: str) -> AllocatorSettings:
    """The allocator model's settings for a workload's ``alloc_conf`` (validated when it was loaded)."""
    return AllocatorSettings.from_conf(alloc_conf)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TrainingSlack:
    """Allocator slack of a step (bytes) and where it comes from."""

    vocabulary_bytes: int
    """Replayed slack of the vocabulary-sized tensors, less what the layers' gradients reuse."""
    layers_bytes: int
    """Closed-form slack of the decoder layers' churn."""
    spread_bytes: int
    """How far above ``layers_bytes`` the replays' upper quartile goes (the reserved margin)."""
    replayed: bool = False
    """The whole step was replayed (sharded parameters): ``layers_bytes`` is that replay's slack."""

    @property
    def total_bytes(self) -> int:
        return self.vocabulary_bytes + self.layers_bytes


#: :class:`TrainingSlack` made as its ``__init__`` would, faster (the fast estimates make one each).
_slack = maker(TrainingSlack)


def training_loss_script(ctx: TrainingContext, mem: StageMemory, targets: frozenset[str] = frozenset()) -> LossScript:
    """The loss requests of the stage (none on a stage without the head), with those of a LoRA
    adapter on the head when ``targets`` name it."""
    if not mem.stage.last:
        return LossScript(forward=(), backward=())
    spec, tp = ctx.spec, ctx.workload.parallel.tp
    if (fused := fused_head(ctx)) is not None:
        return fused_head_script(fused)
    a = model_logits_bytes(ctx)
    chunks = loss_chunks(ctx)
    kept = (4 if fp32_model_outputs(ctx) else a) if ctx.profile.keeps_logits else 0
    script = loss_script(
        ctx.loss,
        tokens=ctx.tokens,
        vocab=spec.vocab_size // tp,
        hidden=spec.hidden_size,
        logits_bytes=a,
        kept_bytes=kept,
        chunks=chunks,
        compiled=ctx.compiled_loss,
        loss_parallel=tp > 1 and ctx.profile.name is Framework.TORCHTITAN,
        softcap=spec.final_logit_softcap is not None,
    )
    head = training_lora_head(ctx, targets, loss_chunks=chunks)
    return script if head is None else with_head_script(script, head, vocab=spec.vocab_size // tp, tokens=ctx.tokens)


def replayed_slack(
    shape: StepShape, loss: LossScript, *, layers: int, micro_steps: int, settings: AllocatorSettings
) -> int:
    """Reserved minus allocated peak (bytes) of the step pattern of ``layers`` decoder layers, each
    request replayed as it is written (:func:`~vramlens.allocator.replaying.replaying_pattern`: the
    peaks of :func:`~vramlens.allocator.pattern.pattern_peaks` without keeping the events)."""
    sink = replaying_pattern(settings)
    step_pattern(shape, loss, layers=layers, micro_steps=micro_steps, into=sink)
    return sink.peaks().slack_bytes


@lru_cache(maxsize=4096)
def _vocabulary_slack(shape: StepShape, loss: LossScript, micro_steps: int, settings: AllocatorSettings) -> int:
    return max(0, replayed_slack(shape, loss, layers=0, micro_steps=micro_steps, settings=settings))


def layer_churn(mem: StageMemory) -> tuple[int, int, int]:
    """Bytes of per-layer memory that a step frees and asks for again, in three kinds: saved
    activations (and the forward's working set); what the backward makes and frees per layer
    (a recomputed layer, the gradient working set); parameter-sized tensors (gradients, step
    temporaries, autocast weight copies, and sharded training's unsharded parameters and
    gradients at their largest)."""
    u = mem.unsharded
    gathered = max(u.forward_layer, u.loss, u.backward_start, u.first_layers, u.last_layer, u.end)
    return (
        mem.activations_bytes + mem.forward_working_bytes,
        mem.recompute_bytes + mem.working_bytes,
        mem.grads_bytes + mem.step_temp_bytes + mem.casts_bytes + gathered,
    )


def layer_gradients(ctx: TrainingContext, mem: StageMemory, edges: StepShape) -> int:
    """Bytes of the decoder layers' gradients allocated during a backward: every trained element
    but the vocabulary matrices' (0 with an optimizer in backward, which frees each at once)."""
    if edges.in_backward:
        return 0
    elements = sum(group.elements for group in mem.stage.trainable) - sum(edges.edge_trained)
    return max(0, elements) * edges.grad_bytes // edges.grads_sharded


@lru_cache(maxsize=256)
def _step_slack(shape: StepShape, loss: LossScript, micro_steps: int, settings: AllocatorSettings) -> int:
    return max(0, replayed_slack(shape, loss, layers=shape.layers, micro_steps=micro_steps, settings=settings))


def training_slack(
    ctx: TrainingContext, mem: StageMemory, targets: frozenset[str], settings: AllocatorSettings
) -> TrainingSlack:
    """Allocator slack of one stage's step (see the module docstring). With parameters sharded
    by FSDP2 (FSDP, HSDP) the whole step is replayed, every layer: its collective buffers sit in
    their streams' pools (:mod:`vramlens.allocator.streams`), each pool's segments reach that
    stream's own peak at its own instant and the pools add up, which no fraction of the churn
    represents (``layers_bytes`` is then that replay's slack, ``vocabulary_bytes`` 0). FSDP2's pattern
    is written buffer by buffer from its code and checked against the simulator's replay
    (``tests/simulator/test_distributed.py``). On one GPU the whole step is replayed as well when the
    workload asks (:func:`replays_whole_step`); DDP, ZeRO and FSDP1 keep the closed form, whose
    vocabulary-sized requests come from a template over the sizes once a stage's size-free settings
    are seen again (:mod:`vramlens.estimator.slack_template`: the same requests, not rebuilt)."""
    micro_steps = min(ctx.workload.grad_accum, 2)
    sharded = ctx.workload.parallel.shard in (Shard.FSDP, Shard.HSDP, Shard.ZERO3)
    key = (settings.expandable_segments, sharded)
    churn = layer_churn(mem)
    spread = int(LAYER_SLACK_SPREAD[key] * sum(churn))
    layers = int(sum(map(operator.mul, LAYER_SLACK_FRACTION[key], churn)))  # fraction x churn, summed in order
    template = _template(ctx, mem, targets, micro_steps, settings)  # none where the whole step is replayed
    if template is not None:
        vocabulary = template.slack(ctx, mem, settings)  # type: ignore[attr-defined]
        less = template.layer_gradients_bytes  # type: ignore[attr-defined]
        return _slack(
            vocabulary_bytes=max(0, vocabulary - less), layers_bytes=layers, spread_bytes=spread, replayed=False
        )
    loss = training_loss_script(ctx, mem, targets)
    edges = step_shape(ctx, mem, targets, layers=False)
    if edges.gather_copy_out or replays_whole_step(ctx):
        whole = _step_slack(step_shape(ctx, mem, targets), loss, micro_steps, settings)
        return TrainingSlack(vocabulary_bytes=0, layers_bytes=whole, spread_bytes=spread, replayed=True)
    vocabulary = _vocabulary_slack(edges, loss, micro_steps, settings)
    return TrainingSlack(
        vocabulary_bytes=max(0, vocabulary - layer_gradients(ctx, mem, edges)), layers_bytes=layers, spread_bytes=spread
    )


#: ``StageMemory.derived`` key of a stage's vocabulary template: absent (first estimate), ``_SEEN``
#: (second: the template is made), the template, or ``_NONE`` (none can be made).
_TEMPLATE = "reserved: vocabulary template"
_SEEN, _NONE = object(), object()
#: Slack results of the templates, by their requests and allocator settings (slack_template.py).
_SHARED_RESULTS: dict[Any, Any] = {}


def _template(
    ctx: TrainingContext, mem: StageMemory, targets: frozenset[str], micro_steps: int, settings: AllocatorSettings
) -> object | None:
    """The stage's vocabulary template, made the second time its size-free settings are seen (a
    single estimate is cheaper without it); None before, or where none can be made."""
    found = mem.derived.get(_TEMPLATE)
    if found is None:
        mem.derived[_TEMPLATE] = _SEEN
        return None
    if found is _SEEN:
        from vramlens.estimator.slack_template import vocabulary_template

        made = vocabulary_template(ctx, mem, targets, micro_steps, settings, _SHARED_RESULTS)
        found = mem.derived[_TEMPLATE] = _NONE if made is None else made
    return None if found is _NONE else found


def replays_whole_step(ctx: TrainingContext) -> bool:
    """The whole step is replayed, every layer, unless the workload says ``reserved_replay: false``
    (3-70 ms an estimate: the planner's search prunes with the closed form and replays only the
    points it keeps) on one GPU without CPU offload,
    for a model vramlens describes layer by layer (not a generic module): the layers' requests are
    written from the estimator's own terms (:mod:`vramlens.estimator.step_shape`) and checked
    against the simulator's replay of the real code's timeline (``tests/simulator/test_agreement.py``)."""
    parallel = ctx.workload.parallel
    one_gpu = parallel.gpus == 1 and parallel.offload is Offload.NONE and ctx.spec.generic is None
    return one_gpu and ctx.workload.reserved_replay


def generation_spread(kv_bytes: int, settings: AllocatorSettings) -> int:
    """The reserved margin of :func:`generation_slack` (``KV_GROWTH_SPREAD``)."""
    return int(KV_GROWTH_SPREAD[settings.expandable_segments] * kv_bytes)


def generation_slack(kv_bytes: int, settings: AllocatorSettings) -> int:
    """Allocator slack (bytes) of transformers' ``generate()`` with a ``DynamicCache`` of
    ``kv_bytes`` at the peak: each decode step concatenates every layer's keys and values into
    tensors one token longer and frees the old ones, and the freed blocks are one token too short
    for the next step's (``KV_GROWTH_FRACTION``, fitted to replays of that growth)."""
    return int(KV_GROWTH_FRACTION[settings.expandable_segments] * kv_bytes)
