"""The quantities of a training step on one pipeline stage: what exists, how big, and why.

:func:`stage_memory` computes each quantity once (weights, optimizer state,
gradients, activations, logits, temporaries) and records a :class:`Term` with
its formula; :mod:`vramlens.estimator.training` adds them up into phases.
"""

from __future__ import annotations

from collections.abc import Callable

from vramlens.categories import Category
from vramlens.estimator.autocast_casts import autocast_casts
from vramlens.estimator.expert_lora import expert_merges
from vramlens.estimator.final_norm import FinalNormPerToken, final_norm_amounts
from vramlens.estimator.fsdp import Unsharded, fsdp_memory
from vramlens.estimator.hook_step import hook_step
from vramlens.estimator.layout import StageView, effective_quant, micro_batches_in_flight
from vramlens.estimator.memo_keys import SizeFreeInputs
from vramlens.estimator.mlp_working import mlp_out_elements
from vramlens.estimator.offload import gradient_buffers
from vramlens.estimator.optimizers import OptimizerModel, optimizer_model
from vramlens.estimator.outside_layers import final_norm_per_token, rotary_buffer_bytes, rotary_per_token
from vramlens.estimator.paged import add_bnb_state
from vramlens.estimator.qlora import dequantized_bytes
from vramlens.estimator.stage_memory import WHOLE_STEP, Formula, StageMemory, Summed, record_effect
from vramlens.estimator.stage_plan import StagePlan, at_seq, build_at_seq, fill_terms, sized_amounts
from vramlens.estimator.trl_head import head_input_per_token
from vramlens.estimator.zero3 import grad_partitions_whole_step
from vramlens.estimator.zero3_terms import zero3_step_gradients, zero3_unsharded
from vramlens.resolve._memo import memo
from vramlens.resolve.context import TrainingContext
from vramlens.units import format_bytes
from vramlens.workload.options import Method, Offload, PipelineSchedule, Quant, Shard

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
        down = mlp_out_elements(ctx.spec) // parallel.tp
        mem.mlp_out_grads_bytes = min(mem.layer_grads_bytes, int(down * ctx.grad_bytes / d_grad))
        mem.formulas["mlp_out_grads_bytes"] = f"{down:,} down-projection weights x {ctx.grad_bytes} B / {d_grad}"


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
    expert_merges(ctx, mem)
    _unsharded(ctx, mem)
    _dequantized(ctx, mem)
    _optimizer_temporaries(ctx, mem)


def _stage_plan(ctx: TrainingContext, stage: StageView, targets: frozenset[str]) -> StagePlan:
    """Build the :class:`StagePlan` (and the :class:`AtSeq` of ``ctx``'s sequence length, in the
    order the quantities were always computed: weights, activations, loss, transients)."""
    parallel = ctx.workload.parallel
    weights = record_effect(stage, lambda scratch: _weights_and_state(ctx, scratch))
    at = build_at_seq(ctx, stage=stage, targets=targets)
    transients = record_effect(stage, lambda scratch: _static_transients(ctx, scratch))
    rotary = rotary_per_token(ctx) if stage.first else 0
    # Final norm (sequence-parallel under TP) and the head's input, which a column-parallel
    # head all-gathers to the full sequence before the matmul.
    final = (final_norm_per_token(ctx) / parallel.tp + head_input_per_token(ctx)) if stage.last else 0
    interleaved = parallel.pp > 1 and parallel.pp_schedule is PipelineSchedule.INTERLEAVED_1F1B
    plan = StagePlan(
        stage=stage,
        weights=weights,
        transients=transients,
        in_flight=micro_batches_in_flight(parallel.pp_schedule, parallel.pp, ctx.workload.grad_accum)
        if stage.first
        else 1,
        outside_per_token=rotary,
        head_side_per_token=final,
        final_norm=final_norm_amounts(ctx) if stage.last else FinalNormPerToken(),
        whole_layer=ctx.workload.recompute.whole_layer,
        notes=("pp_schedule interleaved-1f1b: two model chunks per rank assumed",) if interleaved else (),
    )
    plan.by_seq[ctx.workload.seq] = at
    return plan


def stage_plan(ctx: TrainingContext, stage: StageView, targets: frozenset[str]) -> StagePlan:
    """The :class:`StagePlan` of ``stage``, memoized on the model."""
    key = SizeFreeInputs(part="stage", stage=stage.name, workload=SizeFreeInputs.workload_keys(ctx.workload))
    return memo(ctx.spec, key, lambda: _stage_plan(ctx, stage, targets))


def stage_memory(
    ctx: TrainingContext,
    stage: StageView,
    targets: frozenset[str],
    plan: StagePlan | None = None,
    *,
    terms: bool = True,
) -> StageMemory:
    """Every quantity of one pipeline stage: :func:`stage_plan` (or ``plan``) holds what reads no
    size, and per sequence length the per-token amounts, times the tokens here
    (:func:`~vramlens.estimator.stage_plan.sized_amounts`). ``terms=False``: the quantities alone,
    no term, formula or note (:meth:`~vramlens.estimator.stage_plan.StagePlan.numbers`)."""
    plan = plan or stage_plan(ctx, stage, targets)
    at = at_seq(ctx, stage, targets, plan)
    amounts = sized_amounts(ctx, plan, at)
    if not terms:
        return plan.numbers(amounts)
    mem = plan.memory()
    fill_terms(ctx, mem, plan, at, amounts)
    return mem
