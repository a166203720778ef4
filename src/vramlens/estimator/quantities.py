"""The quantities of a training step on one pipeline stage: what exists, how big, and why.

:func:`stage_memory` computes each quantity once (weights, optimizer state,
gradients, activations, logits, temporaries) and records a :class:`Term` with
its formula; :mod:`vramlens.estimator.training` adds them up into phases.
"""

from __future__ import annotations

from collections.abc import Callable

from vramlens.categories import Category
from vramlens.estimator.autocast_casts import autocast_casts
from vramlens.estimator.fsdp import Unsharded, fsdp_memory
from vramlens.estimator.hook_step import hook_step
from vramlens.estimator.layout import EMBED_NAMES, StageView, effective_quant, micro_batches_in_flight
from vramlens.estimator.logits_terms import logits_terms
from vramlens.estimator.memo_keys import SizeFreeInputs
from vramlens.estimator.offload import gradient_buffers
from vramlens.estimator.optimizers import OptimizerModel, optimizer_model
from vramlens.estimator.outside_layers import final_norm_per_token, rotary_buffer_bytes, rotary_per_token
from vramlens.estimator.paged import add_bnb_state
from vramlens.estimator.qlora import dequantized_bytes
from vramlens.estimator.recompute import LayerActivations, eager_attention_working, layer_activations, train_state
from vramlens.estimator.ring_attention import ring_backward_bytes
from vramlens.estimator.stage_memory import WHOLE_STEP, Formula, StageMemory, Summed, size_free_effect
from vramlens.estimator.trl_head import head_input_per_token
from vramlens.estimator.zero3 import grad_partitions_whole_step
from vramlens.estimator.zero3_terms import zero3_step_gradients, zero3_unsharded
from vramlens.model.modules import layer_linears
from vramlens.resolve.context import TrainingContext
from vramlens.units import format_bytes
from vramlens.workload.options import Method, Offload, PipelineSchedule, Quant, Recompute, Shard

__all__ = ["WHOLE_STEP", "Formula", "StageMemory", "Summed", "stage_memory"]


_PARAM_SHARDED = {Shard.ZERO3, Shard.FSDP, Shard.HSDP}
_GRAD_SHARDED = _PARAM_SHARDED | {Shard.ZERO2}
_STATE_SHARDED = _GRAD_SHARDED | {Shard.ZERO1}


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
            bnb = bool(optimizer.paged or optimizer.fixed_state_bytes) and add_bnb_state(
                ctx, mem, group, optimizer, d_state
            )
            if not bnb:
                mem.add(
                    f"optimizer state ({group.name})",
                    Category.OPTIMIZER_STATE,
                    state / d_state,
                    _state_formula(group.elements, optimizer, group.state_bytes, d_state),
                    into="states_bytes",
                    alive=WHOLE_STEP,
                )
            mem.add(
                f"fp32 master weights ({group.name})",
                Category.OPTIMIZER_STATE,
                master / d_state,
                _per_element_formula(group.elements, group.master_bytes, d_state),
                into="states_bytes",
                alive=WHOLE_STEP,
            )
    mem.add(
        "parameters",
        Category.PARAMETERS,
        params,
        lambda: f"frozen {format_bytes(int(stage.frozen_bytes))} + trainable, / {d_param} shards",
        into="params_bytes",
        alive=WHOLE_STEP,
    )
    rope = rotary_buffer_bytes(ctx)
    mem.add(
        "rotary table buffers (torchtune fp32 rope caches)",
        Category.BUFFERS,
        rope,
        lambda: f"{ctx.spec.max_position_embeddings:,} positions x head_dim {ctx.spec.head_dim} x 4 B, per table",
        into="params_bytes",
        alive=WHOLE_STEP,
    )
    _gradients(ctx, mem)


def _gradients(ctx: TrainingContext, mem: StageMemory) -> None:
    """Gradients (sharded as the strategy shards them, or in CPU memory with an offloaded
    optimizer: :mod:`vramlens.estimator.offload`), ZeRO reduce buckets, DDP buckets, and the
    head's and one layer's gradients for the phases."""
    parallel, stage = ctx.workload.parallel, mem.stage
    d_grad = _sharded(parallel.shard, ctx.shard_group, _GRAD_SHARDED)
    buffers = gradient_buffers(ctx, stage)
    on_cpu_grads = buffers is not None and buffers.partitions_on_cpu
    alive = (
        "whole step (ZeRO-3's grad_partitions_flat_buffer, allocated at initialization)"
        if grad_partitions_whole_step(ctx)
        else "from their layer's backward to the optimizer step"
    )
    for group in stage.trainable if not on_cpu_grads else ():
        mem.add(
            f"gradients ({group.name})",
            Category.GRADIENTS,
            group.elements * group.grad_bytes / d_grad,
            _per_element_formula(group.elements, group.grad_bytes, d_grad),
            into="grads_bytes",
            alive=alive,
        )
    if buffers is not None and buffers.buffer_bytes:
        mem.add(
            "ZeRO reduce buckets",
            Category.GRADIENTS,
            buffers.buffer_bytes,
            buffers.formula,
            into="grad_buckets_bytes",
            alive=WHOLE_STEP,
        )
    if parallel.shard is Shard.DDP:
        mem.add(
            "DDP gradient buckets",
            Category.GRADIENTS,
            mem.grads_bytes,
            "one bucket copy of every gradient (gradient_as_bucket_view=False)",
            into="grad_buckets_bytes",
            alive=WHOLE_STEP,
        )
    if ctx.full and stage.last:
        head = ctx.spec.vocab_size * ctx.spec.hidden_size // parallel.tp
        mem.head_grads_bytes = int(head * ctx.grad_bytes / d_grad)
        mem.formulas["head_grads_bytes"] = (
            f"vocab {ctx.spec.vocab_size:,} x hidden / tp {parallel.tp} x {ctx.grad_bytes} B / {d_grad}"
        )
    if ctx.full:
        layer = int(stage.layer_elements * ctx.grad_bytes / d_grad)
        mem.layer_grads_bytes = layer if on_cpu_grads else min(mem.grads_bytes, layer)
        mem.formulas["layer_grads_bytes"] = f"{stage.layer_elements:,} x {ctx.grad_bytes} B / {d_grad}"


def _activations(ctx: TrainingContext, mem: StageMemory, acts: LayerActivations) -> None:
    """Saved activations of this stage's layers for the micro-batches in flight, plus the recomputed layer."""
    parallel, stage, tokens = ctx.workload.parallel, mem.stage, ctx.tokens
    in_flight = (
        micro_batches_in_flight(parallel.pp_schedule, parallel.pp, ctx.workload.grad_accum) if stage.first else 1
    )
    mem.add(
        "activations (saved for backward)",
        Category.ACTIVATIONS,
        acts.saved_per_token * tokens * in_flight,
        lambda: (
            f"{acts.saved_per_token:,.0f} B/token x {tokens:,} tokens x {in_flight:g} micro-batch(es) in flight ({stage.layers} layers)"
        ),
        into="activations_bytes",
        alive="from each layer's forward to its backward",
    )
    mem.recompute_bytes = int(acts.transient_per_token * tokens)
    mem.formulas["recompute_bytes"] = lambda: f"{acts.transient_per_token:,.0f} B/token x {tokens:,} tokens"
    mem.masks_bytes_per_token = acts.masks_per_token
    mem.mixer_backward_bytes_per_token = acts.mixer_backward_per_token
    mem.add(
        "inputs (ids, labels)",
        Category.INPUTS,
        16 * tokens,
        lambda: f"{tokens:,} tokens x 2 int64",
        into="inputs_bytes",
        alive=WHOLE_STEP,
    )
    rotary = rotary_per_token(ctx) if stage.first else 0
    # Final norm (sequence-parallel under TP) and the head's input, which a column-parallel
    # head all-gathers to the full sequence before the matmul.
    final = (final_norm_per_token(ctx) / parallel.tp + head_input_per_token(ctx)) if stage.last else 0
    mem.add(
        "activations outside the layers (final norm, head input, rotary tables)",
        Category.ACTIVATIONS,
        (rotary + final) * tokens,
        lambda: f"{rotary + final:,.0f} B/token",
        into="non_layer_bytes",
        alive="from the forward to the end of backward",
    )
    mem.notes.extend(acts.notes)
    if parallel.pp > 1 and parallel.pp_schedule is PipelineSchedule.INTERLEAVED_1F1B:
        mem.notes.append("pp_schedule interleaved-1f1b: two model chunks per rank assumed")


def _unsharded(ctx: TrainingContext, mem: StageMemory) -> None:
    """Parameter sharding's unsharded memory, instant by instant (pipeline parallelism keeps the stage gathered)."""
    parallel = ctx.workload.parallel
    if parallel.pp > 1 and parallel.shard in _PARAM_SHARDED:
        _pipeline_unsharded(ctx, mem)
    else:
        mem.unsharded = (
            zero3_unsharded(ctx, mem.stage, mem.add, mem.notes)
            if parallel.shard is Shard.ZERO3 and ctx.zero is not None
            else fsdp_memory(ctx, mem.stage, mem.add, mem.notes)
        )


def _dequantized(ctx: TrainingContext, mem: StageMemory) -> None:
    """A k-bit base's dequantized weight, one linear at a time (PEFT methods on a quantized base)."""
    if ctx.method is Method.FULL or effective_quant(ctx) is Quant.NONE:
        return
    d, largest = dequantized_bytes(ctx), mem.stage.largest_linear
    mem.add(
        "dequantized weight (one linear at a time)",
        Category.TEMPORARY,
        largest * d,
        lambda: f"{largest:,} x {d} B",
        into="dequant_bytes",
        alive="inside one linear",
    )


def _working_sets(ctx: TrainingContext, mem: StageMemory, targets: frozenset[str]) -> None:
    """Intermediates of the layer being computed that nobody keeps (measured on CPU for
    transformers' Llama layer, see tests/estimator/test_training_hf.py):

    * backward: gradients flowing through the MLP (two ``a*i`` tensors) and the hidden
      state (two ``a*h``); with recompute the recomputed layer's own tensors are freed as
      its backward proceeds, leaving ``a*(i + h)``, plus the adapters' output gradient;
    * forward: the norm's fp32 intermediate and the layer output (``4h + a*h``), or the
      LoRA adapter sums on the MLP if larger; under recompute nothing is kept, so the
      MLP's live intermediates (``2*a*i + a*h``) plus the adapter sums;
    * a state mixer's scan backward (Mamba 1's gradient buffers), beside its layer less what that
      layer freed before it (``mem.mixer_backward_bytes_per_token``, :func:`vramlens.estimator.recompute.scan_backward_beyond`).
    """
    spec, a, tokens, tp = ctx.spec, ctx.compute_bytes, ctx.tokens, ctx.workload.parallel.tp
    h = spec.hidden_size
    inner = spec.mlp.intermediate_size if spec.mlp else spec.moe.expert_intermediate_size * spec.moe.experts_per_token  # type: ignore[union-attr]
    # Full recompute (and offload) keeps no layer's internals: its MLP intermediates are
    # transient; selective recompute keeps them as saved activations.
    recompute = ctx.workload.recompute in (Recompute.FULL, Recompute.OFFLOAD) and mem.recompute_bytes > 0
    adapter_sum, adapter_grad = _adapter_transients(ctx, targets, inner)
    backward = a * (inner + h) + adapter_grad if recompute else a * (2 * inner + 2 * h)
    forward = (a * h + 2 * a * inner + adapter_sum) if recompute else max(4 * h + a * h, adapter_sum)
    # Eager attention's score tensors come and go apart from the MLP's intermediates; a recomputed
    # layer's forward runs inside the backward pass, its kept tensors counted as the transient.
    over_kept, eager_backward, eager_forward = eager_attention_working(
        ctx, train_state(ctx, targets), mem.stage.layer_range
    )
    mem.forward_besides_scores_bytes = int(tokens * (forward / tp + mem.masks_bytes_per_token))
    forward = max(forward, eager_forward if recompute else over_kept)
    backward = max(backward, eager_backward, over_kept if recompute else 0)
    # A state mixer's scan backward (recompute.scan_backward_beyond), already per rank.
    scan = mem.mixer_backward_bytes_per_token
    ring = ring_backward_bytes(ctx)
    mem.working_bytes = max(int(tokens * max(backward / tp, scan)), ring)
    mem.forward_working_bytes = int(tokens * (forward / tp + mem.masks_bytes_per_token))
    masks = mem.masks_bytes_per_token
    mem.formulas["working_bytes"] = lambda: (
        f"max({backward:,.0f} B/token / tp {tp}, scan backward {scan:,.0f} B/token) x {tokens:,} tokens"
        + (f"; ring attention backward (cp {ctx.workload.parallel.cp}) {format_bytes(ring)} if larger" if ring else "")
    )
    mem.formulas["forward_working_bytes"] = lambda: (
        f"({forward:,.0f} B/token / tp {tp} + masks {masks:,.0f} B/token) x {tokens:,} tokens"
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
        alive=WHOLE_STEP,
    )
    mem.unsharded = Unsharded.constant(gathered, how=f"pipeline stage kept unsharded: {elements:,} x {a} B")
    accumulate = 4 if ctx.grad_bytes == 4 else ctx.grad_bytes
    mem.add(
        "unsharded accumulated gradients (pipeline micro-batches)",
        Category.GRADIENTS,
        stage.trainable_elements * accumulate,
        lambda: f"{stage.trainable_elements:,} x {accumulate} B",
        into="grad_buckets_bytes",
        alive=WHOLE_STEP,
    )


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
    if ctx.in_backward_step:
        hook_step(ctx, mem, optimizer, _sharded(ctx.workload.parallel.shard, ctx.shard_group, _GRAD_SHARDED))
    fp32_grads = sum(group.elements * 4 / d_state for group in mem.stage.trainable if group.master_bytes)
    mem.add(
        f"optimizer step temporaries ({ctx.optimizer_impl})",
        Category.TEMPORARY,
        temporaries,
        lambda: f"{optimizer.name.value}: {optimizer.temporaries_formula(ctx.optimizer_impl)}",
        into="step_temp_bytes",
        alive="inside optimizer.step()",
    )
    if ctx.zero is not None and ctx.workload.parallel.shard is Shard.ZERO3 and fp32_grads:
        zero3_step_gradients(ctx, mem, d_state)
        return
    mem.add(
        "fp32 gradient partition (master-weight optimizer step)",
        Category.TEMPORARY,
        fp32_grads,
        lambda: f"trainable elements x 4 B / {d_state}",
        into="step_temp_bytes",
        alive="inside optimizer.step()",
    )


def _static_transients(ctx: TrainingContext, mem: StageMemory) -> None:
    """The short-lived memory that depends on the model and the parallelism only: autocast casts,
    gathered shards, a dequantized weight, the optimizer step's temporaries."""
    autocast_casts(ctx, mem)
    _unsharded(ctx, mem)
    _dequantized(ctx, mem)
    _optimizer_temporaries(ctx, mem)


def stage_memory(ctx: TrainingContext, stage: StageView, targets: frozenset[str]) -> StageMemory:
    """Every quantity of one pipeline stage (the parts that read neither batch nor sequence length
    memoized on the model: :class:`~vramlens.estimator.memo_keys.SizeFreeInputs`)."""
    mem, keys = StageMemory(stage=stage), SizeFreeInputs.workload_keys(ctx.workload)
    mem.apply(size_free_effect(ctx, stage, keys, "weights and state", lambda scratch: _weights_and_state(ctx, scratch)))
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
    mem.apply(size_free_effect(ctx, stage, keys, "transients", lambda scratch: _static_transients(ctx, scratch)))
    _working_sets(ctx, mem, targets)
    return mem
