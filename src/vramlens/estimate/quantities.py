"""The quantities of a training step on one pipeline stage: what exists, how big, and why.

:func:`stage_memory` computes each quantity once (weights, optimizer state,
gradients, activations, logits, temporaries) and records a :class:`Term` with
its formula; :mod:`vramlens.estimate.training` adds them up into phases.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from vramlens.categories import Category
from vramlens.estimate.context import TrainingContext
from vramlens.estimate.fsdp import Unsharded, fsdp_memory
from vramlens.estimate.layout import EMBED_NAMES, StageView, effective_quant, micro_batches_in_flight
from vramlens.estimate.logits import LogitsMemory, logits_memory
from vramlens.estimate.lora_head import training_lora_head, with_lora_head
from vramlens.estimate.loss_outputs import fp32_model_outputs, loss_chunks, model_logits_bytes
from vramlens.estimate.offload import gradient_buffers
from vramlens.estimate.optimizers import OptimizerModel, optimizer_model
from vramlens.estimate.qlora import dequantized_bytes, with_head_weight_cast
from vramlens.estimate.recompute import LayerActivations, eager_attention_working, layer_activations, train_state
from vramlens.estimate.versions import older_than, rule_note
from vramlens.model.modules import layer_linears
from vramlens.report.model import Term
from vramlens.units import format_bytes
from vramlens.workload.options import Framework, Method, Offload, PipelineSchedule, Quant, Recompute, Shard

__all__ = ["StageMemory", "stage_memory"]

_PARAM_SHARDED = {Shard.ZERO3, Shard.FSDP, Shard.HSDP}
_GRAD_SHARDED = _PARAM_SHARDED | {Shard.ZERO2}
_STATE_SHARDED = _GRAD_SHARDED | {Shard.ZERO1}


@dataclass(kw_only=True)
class StageMemory:
    """Named quantities of one pipeline stage (bytes), with the terms that explain them."""

    stage: StageView
    params: int = 0
    states: int = 0
    paged_states: int = 0
    grads: int = 0
    grad_buckets: int = 0
    head_grads: int = 0
    layer_grads: int = 0
    """Gradients of one decoder layer (full fine-tuning), produced last for the first layer."""
    activations: int = 0
    recompute: int = 0
    non_layer: int = 0
    inputs: int = 0
    logits: LogitsMemory | None = None
    casts: int = 0
    casts_backward: int = 0
    unsharded: Unsharded = field(default_factory=Unsharded)
    """Parameter sharding's unsharded parameters, buffers and gradients, instant by instant (fsdp.py)."""
    dequant: int = 0
    working: int = 0
    end_working: int | None = None
    """The backward working set when only the embedding's backward is left (None: ``working``)."""
    forward_working: int = 0
    masks: float = 0.0
    """Attention masks alive during the forward only, bytes per token (see LayerActivations)."""
    mixer_backward: float = 0.0
    """A state mixer's scan backward beyond its layer, bytes per token on one rank (see LayerActivations)."""
    step_temp: int = 0
    terms: list[Term] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, name: str, category: Category, value: float, formula: Callable[[], str] | str) -> int:
        amount = int(value)
        if amount:
            self.terms.append(Term(name=name, category=category, bytes=amount, explain=formula))
        return amount


def _sharded(shard: Shard, group: int, kinds: set[Shard]) -> int:
    return group if shard in kinds else 1


def _state_formula(elements: int, optimizer: OptimizerModel, state_bytes: int, shards: int) -> Callable[[], str]:
    return lambda: f"{elements:,} x {optimizer.state_formula(state_bytes)} / {shards}"


def _per_element_formula(elements: int, bytes_each: int, shards: int) -> Callable[[], str]:
    return lambda: f"{elements:,} x {bytes_each} B / {shards}"


def _weights_and_state(ctx: TrainingContext, mem: StageMemory) -> None:
    """Persistent: parameters, optimizer state (+ fp32 master), gradients, DDP buckets."""
    parallel, stage = ctx.workload.parallel, mem.stage
    d_param = _sharded(parallel.shard, ctx.shard_group, _PARAM_SHARDED)
    d_state = _sharded(parallel.shard, ctx.shard_group, _STATE_SHARDED)
    on_cpu_params = parallel.offload is Offload.OPTIMIZER_PARAMS
    on_cpu_state = parallel.offload is not Offload.NONE
    optimizer = optimizer_model(ctx.workload.optimizer)
    params = 0.0 if on_cpu_params else stage.frozen_bytes / d_param
    for group in stage.trainable:
        if not on_cpu_params:
            params += group.elements * group.param_bytes / d_param
        state = optimizer.state_bytes(group.elements, group.state_bytes)
        master = group.elements * group.master_bytes
        if not on_cpu_state:
            if optimizer.paged:
                mem.paged_states += int(state / d_state)
            else:
                mem.states += mem.add(
                    f"optimizer state ({group.name})",
                    Category.OPTIMIZER_STATE,
                    state / d_state,
                    _state_formula(group.elements, optimizer, group.state_bytes, d_state),
                )
            mem.states += mem.add(
                f"fp32 master weights ({group.name})",
                Category.OPTIMIZER_STATE,
                master / d_state,
                _per_element_formula(group.elements, group.master_bytes, d_state),
            )
    mem.params = mem.add(
        "parameters",
        Category.PARAMETERS,
        params,
        lambda: f"frozen {format_bytes(int(stage.frozen_bytes))} + trainable, / {d_param} shards",
    )
    _gradients(ctx, mem)


def _gradients(ctx: TrainingContext, mem: StageMemory) -> None:
    """Gradients (sharded as the strategy shards them, or in CPU memory with an offloaded
    optimizer: :mod:`vramlens.estimate.offload`), ZeRO reduce buckets, DDP buckets, and the
    head's and one layer's gradients for the phases."""
    parallel, stage = ctx.workload.parallel, mem.stage
    d_grad = _sharded(parallel.shard, ctx.shard_group, _GRAD_SHARDED)
    buffers = gradient_buffers(ctx, stage)
    on_cpu_grads = buffers is not None and buffers.partitions_on_cpu
    for group in stage.trainable if not on_cpu_grads else ():
        mem.grads += mem.add(
            f"gradients ({group.name})",
            Category.GRADIENTS,
            group.elements * group.grad_bytes / d_grad,
            _per_element_formula(group.elements, group.grad_bytes, d_grad),
        )
    if buffers is not None and buffers.buffer_bytes:
        mem.grad_buckets = mem.add("ZeRO reduce buckets", Category.GRADIENTS, buffers.buffer_bytes, buffers.formula)
    if parallel.shard is Shard.DDP:
        mem.grad_buckets = mem.add(
            "DDP gradient buckets",
            Category.GRADIENTS,
            mem.grads,
            "one bucket copy of every gradient (gradient_as_bucket_view=False)",
        )
    if ctx.full and stage.last:
        head = ctx.spec.vocab_size * ctx.spec.hidden_size // parallel.tp
        mem.head_grads = int(head * ctx.grad_bytes / d_grad)
    if ctx.full:
        layer = int(stage.layer_elements * ctx.grad_bytes / d_grad)
        mem.layer_grads = layer if on_cpu_grads else min(mem.grads, layer)


def _activations(ctx: TrainingContext, mem: StageMemory, acts: LayerActivations) -> None:
    """Saved activations of this stage's layers for the micro-batches in flight, plus the recomputed layer."""
    parallel, stage, tokens = ctx.workload.parallel, mem.stage, ctx.tokens
    in_flight = (
        micro_batches_in_flight(parallel.pp_schedule, parallel.pp, ctx.workload.grad_accum) if stage.first else 1
    )
    mem.activations = mem.add(
        "activations (saved for backward)",
        Category.ACTIVATIONS,
        acts.saved_per_token * tokens * in_flight,
        lambda: (
            f"{acts.saved_per_token:,.0f} B/token x {tokens:,} tokens x {in_flight:g} micro-batch(es) in flight ({stage.layers} layers)"
        ),
    )
    mem.recompute = int(acts.transient_per_token * tokens)
    mem.masks = acts.masks_per_token
    mem.mixer_backward = acts.mixer_backward_per_token
    h, a = ctx.spec.hidden_size, ctx.compute_bytes
    mem.inputs = mem.add("inputs (ids, labels)", Category.INPUTS, 16 * tokens, lambda: f"{tokens:,} tokens x 2 int64")
    rotary = 2 * a * ctx.spec.head_dim if stage.first else 0
    # Final norm (sequence-parallel under TP) and the head's input, which a column-parallel
    # head all-gathers to the full sequence before the matmul.
    final = ((4 * h + 4 + (a * h if ctx.full else 0)) / parallel.tp + (a * h if ctx.full else 0)) if stage.last else 0
    mem.non_layer = mem.add(
        "activations outside the layers (final norm, head input, rotary tables)",
        Category.ACTIVATIONS,
        (rotary + final) * tokens,
        lambda: f"{rotary + final:,.0f} B/token",
    )
    mem.notes.extend(acts.notes)
    if parallel.pp > 1 and parallel.pp_schedule is PipelineSchedule.INTERLEAVED_1F1B:
        mem.notes.append("pp_schedule interleaved-1f1b: two model chunks per rank assumed")


def _transients(ctx: TrainingContext, mem: StageMemory, targets: frozenset[str]) -> None:
    """Short-lived memory: autocast casts, gathered shards, dequantized weights, backward working set."""
    parallel, stage, a = ctx.workload.parallel, mem.stage, ctx.compute_bytes
    spec = ctx.spec
    if ctx.autocast and ctx.full:
        linear = stage.trainable_elements - stage.layers * spec.norms_per_layer * spec.hidden_size
        mem.casts = mem.add(
            "autocast bf16 weight copies (autocast cache, until the forward ends)",
            Category.TEMPORARY,
            linear * a,
            lambda: f"{linear:,} weights x {a} B",
        )
        mem.casts_backward = _casts_in_backward(ctx, mem.casts, stage.layers)
    if parallel.pp > 1 and parallel.shard in _PARAM_SHARDED:
        _pipeline_unsharded(ctx, mem)
    else:
        mem.unsharded = fsdp_memory(ctx, stage, mem.add, mem.notes)
    quant = effective_quant(ctx)
    if ctx.method is not Method.FULL and quant is not Quant.NONE:
        d = dequantized_bytes(ctx)
        mem.dequant = mem.add(
            "dequantized weight (one linear at a time)",
            Category.TEMPORARY,
            stage.largest_linear * d,
            lambda: f"{stage.largest_linear:,} x {d} B",
        )
    _working_sets(ctx, mem, targets)


def _working_sets(ctx: TrainingContext, mem: StageMemory, targets: frozenset[str]) -> None:
    """Intermediates of the layer being computed that nobody keeps (measured on CPU for
    transformers' Llama layer, see tests/estimate/test_training_hf.py):

    * backward: gradients flowing through the MLP (two ``a*i`` tensors) and the hidden
      state (two ``a*h``); with recompute the recomputed layer's own tensors are freed as
      its backward proceeds, leaving ``a*(i + h)``, plus the adapters' output gradient;
    * forward: the norm's fp32 intermediate and the layer output (``4h + a*h``), or the
      LoRA adapter sums on the MLP if larger; under recompute nothing is kept, so the
      MLP's live intermediates (``2*a*i + a*h``) plus the adapter sums;
    * a state mixer's scan backward (Mamba 1's gradient buffers), beside its layer less what that
      layer freed before it (``mem.mixer_backward``, :func:`vramlens.estimate.recompute.scan_backward_beyond`).
    """
    spec, a, tokens, tp = ctx.spec, ctx.compute_bytes, ctx.tokens, ctx.workload.parallel.tp
    h = spec.hidden_size
    inner = spec.mlp.intermediate_size if spec.mlp else spec.moe.expert_intermediate_size * spec.moe.experts_per_token  # type: ignore[union-attr]
    # Full recompute (and offload) keeps no layer's internals: its MLP intermediates are
    # transient; selective recompute keeps them as saved activations.
    recompute = ctx.workload.recompute in (Recompute.FULL, Recompute.OFFLOAD) and mem.recompute > 0
    adapter_sum, adapter_grad = _adapter_transients(ctx, targets, inner)
    backward = a * (inner + h) + adapter_grad if recompute else a * (2 * inner + 2 * h)
    forward = (a * h + 2 * a * inner + adapter_sum) if recompute else max(4 * h + a * h, adapter_sum)
    # Eager attention's score tensors come and go apart from the MLP's intermediates; a recomputed
    # layer's forward runs inside the backward pass, its kept tensors counted as the transient.
    over_kept, eager_backward, eager_forward = eager_attention_working(
        ctx, train_state(ctx, targets), mem.stage.layer_range
    )
    forward = max(forward, eager_forward if recompute else over_kept)
    backward = max(backward, eager_backward, over_kept if recompute else 0)
    # A state mixer's scan backward (recompute.scan_backward_beyond), already per rank.
    mem.working = int(tokens * max(backward / tp, mem.mixer_backward))
    mem.forward_working = int(tokens * (forward / tp + mem.masks))


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


def _casts_in_backward(ctx: TrainingContext, casts: int, layers: int) -> int:
    """Autocast weight casts alive in backward: those saved by layers that were not
    checkpointed (the cache itself is cleared when the forward's autocast region exits),
    plus one recomputed layer's casts."""
    if ctx.workload.recompute is Recompute.NONE or layers == 0:
        return casts
    if ctx.workload.recompute is Recompute.FULL:
        kept = layers - math.ceil(layers / ctx.workload.recompute_every)
        return int(casts * (kept + 1) / layers)
    return int(casts / layers)


def _pipeline_unsharded(ctx: TrainingContext, mem: StageMemory) -> None:
    """FSDP under pipeline parallelism keeps the stage unsharded for the whole step.

    torchtitan applies FSDP2 with ``reshard_after_forward=False`` when PP is on, and
    torch.distributed.pipelining disables gradient sync for all but the last
    micro-batch, so unsharded gradients (in the fp32 reduce dtype) accumulate.
    """
    stage, a = mem.stage, ctx.compute_bytes
    elements = stage.trainable_elements + int(stage.frozen_bytes / max(ctx.frozen_bytes, 1))
    gathered = mem.add(
        "unsharded stage parameters (pipeline: not resharded after forward)",
        Category.TEMPORARY,
        elements * a,
        lambda: f"{elements:,} x {a} B",
    )
    mem.unsharded = Unsharded.constant(gathered)
    accumulate = 4 if ctx.grad_bytes == 4 else ctx.grad_bytes
    unsharded = mem.add(
        "unsharded accumulated gradients (pipeline micro-batches)",
        Category.GRADIENTS,
        stage.trainable_elements * accumulate,
        lambda: f"{stage.trainable_elements:,} x {accumulate} B",
    )
    mem.grad_buckets += unsharded


def _optimizer_temporaries(ctx: TrainingContext, mem: StageMemory) -> None:
    """The step's temporaries (foreach / per-tensor copies) and, with fp32 master weights,
    the fp32 gradient partition the optimizer steps on (DeepSpeed/Megatron up-cast the
    reduced bf16 gradients into it)."""
    optimizer = optimizer_model(ctx.workload.optimizer)
    d_state = _sharded(ctx.workload.parallel.shard, ctx.shard_group, _STATE_SHARDED)
    if ctx.workload.parallel.offload is not Offload.NONE:
        return
    temporaries = sum(
        optimizer.step_temporary_bytes(
            ctx.optimizer_impl, group.elements // d_state, group.largest_tensor or group.elements, group.state_bytes
        )
        for group in mem.stage.trainable
    )
    fp32_grads = sum(group.elements * 4 / d_state for group in mem.stage.trainable if group.master_bytes)
    mem.step_temp = mem.add(
        f"optimizer step temporaries ({ctx.optimizer_impl})",
        Category.TEMPORARY,
        temporaries,
        lambda: f"{optimizer.name.value}: {optimizer.temporaries_formula(ctx.optimizer_impl)}",
    )
    mem.step_temp += mem.add(
        "fp32 gradient partition (master-weight optimizer step)",
        Category.TEMPORARY,
        fp32_grads,
        lambda: f"trainable elements x 4 B / {d_state}",
    )


def stage_memory(ctx: TrainingContext, stage: StageView, targets: frozenset[str]) -> StageMemory:
    """Every quantity of one pipeline stage."""
    mem = StageMemory(stage=stage)
    _weights_and_state(ctx, mem)
    acts = layer_activations(ctx, train_state(ctx, targets), stage.layer_range)
    if ctx.method is Method.FREEZE and not EMBED_NAMES & set(ctx.workload.lora.modules_to_save):
        acts = LayerActivations(
            saved_per_token=0.0,
            transient_per_token=0.0,
            full_layer_parts=acts.full_layer_parts,
            notes=("only the head trains: no layer activations are kept",),
        )
    _activations(ctx, mem, acts)
    if stage.last:
        logits_terms(ctx, mem, targets)
    _transients(ctx, mem, targets)
    _optimizer_temporaries(ctx, mem)
    return mem


def logits_terms(ctx: TrainingContext, mem: StageMemory, targets: frozenset[str] = frozenset()) -> None:
    """The last stage's logits and loss, the LM head's bf16 weight copy after k-bit preparation, a LoRA head."""
    tp = ctx.workload.parallel.tp
    fp32_outputs = fp32_model_outputs(ctx)
    if ctx.profile.name in (Framework.HF, Framework.PLAIN) and older_than(ctx.workload.versions, "loss_upcast"):
        mem.notes.append(rule_note(ctx.workload.versions, "loss_upcast"))
    mem.logits = logits_memory(
        ctx.loss,
        tokens=ctx.tokens,
        vocab=ctx.spec.vocab_size // tp,
        hidden=ctx.spec.hidden_size,
        logits_bytes=model_logits_bytes(ctx),
        keeps_logits=ctx.profile.keeps_logits,
        chunks=loss_chunks(ctx),
        kept_bytes=4 if fp32_outputs else None,
        loss_parallel=tp > 1 and ctx.profile.name is Framework.TORCHTITAN,
        compiled=ctx.compiled_loss,
        softcap=ctx.spec.final_logit_softcap is not None,
    )
    if (head := training_lora_head(ctx, targets, loss_chunks=loss_chunks(ctx))) is not None:
        mem.logits = with_lora_head(mem.logits, head, ctx.tokens)
        mem.non_layer += mem.add("LoRA head input (saved)", Category.ACTIVATIONS, head.saved * ctx.tokens, head.formula)
    mem.add("logits and loss (at the loss)", Category.TEMPORARY, mem.logits.forward_end, mem.logits.formula)
    mem.logits, cast = with_head_weight_cast(ctx, mem.logits)
    mem.add("LM head bf16 weight copy (fp32 head after k-bit preparation)", Category.TEMPORARY, cast, "V x h x 2 B")
