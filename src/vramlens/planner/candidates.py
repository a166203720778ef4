"""The planner's search space: structural groups and, inside each, an ordered grid of memory knobs.

A *group* fixes what changes the shape of the run: method (and quantization), precision,
and the parallel layout (tp, pp, data-parallel strategy, shard group). Inside a group every
*knob* is an ordered axis, least memory-saving first:

======================  =================================================================
recompute               none, full every 4th layer, every 2nd, every layer, offload; and
                        none, selective, full every layer, offload (two chains)
loss                    the user's, then the more saving of chunked, fused-linear (Liger)
optimizer               the user's; for AdamW also adamw-8bit, paged-adamw-8bit (bitsandbytes)
offload                 none, optimizer, optimizer+params (only where the strategy allows it; ZeRO-1/2
                        with and without offload are groups of their own: not monotone there)
micro-batch             the samples per data-parallel rank (the user's global batch over the
                        layout's dp) split as batch x grad_accum, largest micro-batch first;
                        the global batch ``batch x grad_accum x dp`` never changes and layouts
                        whose dp does not divide it are skipped
======================  =================================================================

The order is what the search's monotonicity pruning relies on: moving one step along an axis
never raises the estimated peak (recompute, chunked losses, 8-bit state, CPU offload and
smaller micro-batches each only drop terms). The pruning only skips estimating configurations
that are implied to fit; every configuration the planner returns was estimated on its own.

Decisions (documented in the README's planner section):

* precision: the user's is kept; a user in ``fp32`` is also offered ``mixed-bf16`` (automatic
  mixed precision keeps fp32 master weights, so the optimizer math is unchanged). Pure ``bf16``
  weights change the numerics (the seed 004 table: eval perplexity 152 -> 180), so they count
  as a method change and are offered only with ``allow_method_change``.
* method: LoRA and QLoRA (NF4 base weights) only with ``allow_method_change``.
* parallel: tp <= 8 (one NVLink node), tp x pp dividing the GPUs; every data-parallel strategy
  for the remaining ranks, HSDP with each proper shard-group size. On one data-parallel rank
  ZeRO-3 is offered only together with CPU offload (DeepSpeed ZeRO-Offload / ZeRO-Infinity);
  without offload it would equal no sharding. Layouts the estimator rejects (heads or layers
  not divisible) are skipped by the search.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from vramlens.errors import InputError
from vramlens.estimator.layout import param_layout
from vramlens.estimator.logits_terms import loss_memory
from vramlens.estimator.quantities import stage_memory
from vramlens.model.spec import ModelSpec
from vramlens.resolve.context import TrainingContext, resolve_training
from vramlens.workload.options import (
    LossImpl,
    Method,
    Offload,
    OptimizerName,
    Precision,
    Quant,
    Recompute,
    Shard,
)
from vramlens.workload.ranges import RANGES
from vramlens.workload.spec import Parallelism, Workload

__all__ = ["RECOMPUTE_CHAINS", "Group", "Knobs", "apply_knobs", "groups", "knob_axes", "layouts", "per_rank_samples"]

T = TypeVar("T")

#: Largest tensor-parallel degree offered: TP all-reduces every layer and belongs inside one
#: NVLink domain of 8 GPUs (Megatron-LM paper, Narayanan et al. 2021, section 3.3).
MAX_TP = 8
#: Recompute settings: (policy, every k-th layer), in two chains, each least memory-saving
#: first. Selective recompute (attention internals only) and full checkpointing of every 4th or
#: 2nd layer are not ordered against each other (Gemma-2-2B, eager attention, one H100: 117.7 GB
#: selective, 133.8 GB full every 4th), so the search walks each chain on its own.
RECOMPUTE_CHAINS: tuple[tuple[tuple[Recompute, int], ...], ...] = (
    ((Recompute.NONE, 1), (Recompute.FULL, 4), (Recompute.FULL, 2), (Recompute.FULL, 1), (Recompute.OFFLOAD, 1)),
    ((Recompute.NONE, 1), (Recompute.SELECTIVE, 1), (Recompute.FULL, 1), (Recompute.OFFLOAD, 1)),
)
#: Every recompute setting the planner tries (the union of the chains).
RECOMPUTE_ORDER: tuple[tuple[Recompute, int], ...] = (
    (Recompute.NONE, 1),
    (Recompute.SELECTIVE, 1),
    (Recompute.FULL, 4),
    (Recompute.FULL, 2),
    (Recompute.FULL, 1),
    (Recompute.OFFLOAD, 1),
)
#: Loss paths, least memory-saving first: full fp32 logits, chunked cross-entropy, fused
#: linear + cross-entropy (logits never whole).
LOSS_ORDER = (LossImpl.FULL, LossImpl.CHUNKED, LossImpl.FUSED_LINEAR)
#: 8-bit alternatives offered to an AdamW user (bitsandbytes' blockwise 8-bit state).
ADAMW_FAMILY = (OptimizerName.ADAMW, OptimizerName.PAGED_ADAMW)
EIGHT_BIT = (OptimizerName.ADAMW_8BIT, OptimizerName.PAGED_ADAMW_8BIT)
PARAM_SHARDING = (Shard.ZERO3, Shard.FSDP, Shard.HSDP)


@dataclass(frozen=True, kw_only=True, slots=True)
class Group:
    """One structural choice: method/quant, precision and parallel layout (without offload)."""

    method: Method
    quant: Quant
    precision: Precision
    parallel: Parallelism


@dataclass(frozen=True, kw_only=True, slots=True)
class Knobs:
    """One point of a group's knob grid (each field a value from its ordered axis)."""

    recompute: tuple[Recompute, int]
    loss: LossImpl
    optimizer: OptimizerName
    offload: Offload
    micro_batch: int


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, by trial division up to its square root
    (``n`` is a GPU count or a data-parallel degree: at most 2**20, so at most 1,024 steps)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def _precisions(user: Workload, allow_method_change: bool) -> list[Precision]:
    options = [user.precision]
    if user.precision is Precision.FP32:
        options.append(Precision.MIXED_BF16)
    if allow_method_change and Precision.BF16 not in options:
        options.append(Precision.BF16)
    return options


def _methods(user: Workload, allow_method_change: bool) -> list[tuple[Method, Quant]]:
    options = [(user.method, user.quant)]
    if allow_method_change:
        for option in ((Method.LORA, Quant.NONE), (Method.QLORA, Quant.NF4)):
            if option not in options:
                options.append(option)
    return options


def _strategies(dp: int) -> list[tuple[Shard, int | None]]:
    if dp == 1:
        return [(Shard.NONE, None), (Shard.ZERO3, None)]
    found: list[tuple[Shard, int | None]] = [(s, None) for s in (Shard.DDP, Shard.ZERO1, Shard.ZERO2, Shard.ZERO3)]
    found.append((Shard.FSDP, None))
    found.extend((Shard.HSDP, d) for d in _divisors(dp) if 1 < d < dp)
    return found


def layouts(user: Workload, gpus: int) -> Iterator[Parallelism]:
    """Every parallel layout (offload none) over ``gpus`` with the user's cp/ep/schedule."""
    base = user.parallel
    for tp in (d for d in _divisors(gpus) if d <= MAX_TP):
        for pp in _divisors(gpus // tp):
            if (gpus // (tp * pp)) % base.cp:
                continue
            dp = gpus // (tp * pp * base.cp)
            for shard, degree in _strategies(dp):
                try:
                    yield dataclasses.replace(
                        base, gpus=gpus, tp=tp, pp=pp, shard=shard, shard_degree=degree, offload=Offload.NONE
                    )
                except Exception:
                    continue


def groups(user: Workload, gpus: int, *, allow_method_change: bool) -> list[Group]:
    """The structural groups, the user's own method and precision first."""
    return [
        Group(method=method, quant=quant, precision=precision, parallel=with_offload)
        for method, quant in _methods(user, allow_method_change)
        for precision in _precisions(user, allow_method_change)
        for parallel in layouts(user, gpus)
        if per_rank_samples(user, parallel)
        for with_offload in _zero12_offloads(parallel)
    ]


def _zero12_offloads(parallel: Parallelism) -> list[Parallelism]:
    """ZeRO-1/2 layouts once without and once with optimizer offload, as groups of their own:
    offloading there can raise the peak (DeepSpeed keeps a GPU staging buffer as large as the
    largest parameter, ``temp_grad_buffer_for_gpu_offload``, which outweighs the sharded state of
    a small optimizer such as Adafactor), so it is not a monotone knob axis."""
    if parallel.shard not in (Shard.ZERO1, Shard.ZERO2):
        return [parallel]
    return [parallel, _with_offload(parallel, Offload.OPTIMIZER)]


def _offloads(parallel: Parallelism) -> list[Offload]:
    if parallel.shard in (Shard.NONE, Shard.DDP):
        return [Offload.NONE]
    if parallel.shard not in PARAM_SHARDING:
        return [parallel.offload]  # its group's own (_zero12_offloads)
    if parallel.dp == 1:  # ZeRO-3 on one data-parallel rank only makes sense with offload
        return [Offload.OPTIMIZER, Offload.OPTIMIZER_PARAMS]
    return [Offload.NONE, Offload.OPTIMIZER, Offload.OPTIMIZER_PARAMS]


def per_rank_samples(user: Workload, parallel: Parallelism) -> int:
    """Samples each data-parallel rank processes per step so that the user's global batch
    (``batch x grad_accum x dp``) is unchanged; 0 when ``parallel.dp`` does not divide it."""
    total = user.global_batch
    return total // parallel.dp if total % parallel.dp == 0 else 0


def _micro_batches(user: Workload, parallel: Parallelism) -> list[int]:
    """Divisors of the per-rank samples: the user's micro-batch, powers of two, largest first
    (the powers of two that divide ``total`` are those up to its lowest set bit)."""
    total = per_rank_samples(user, parallel)
    options = {1 << k for k in range((total & -total).bit_length())} | {total}
    if total % user.batch == 0:
        options.add(user.batch)
    most_steps = RANGES["grad_accum"].high  # a split into more micro-batches is no workload
    return sorted((d for d in options if total // d <= most_steps), reverse=True)


def _more_saving_losses(loss: LossImpl) -> list[LossImpl]:
    """The loss paths that save more memory than ``loss`` (``auto`` counts as full logits), in
    :data:`LOSS_ORDER`: an axis must only lower the peak, so a user already on the fused
    path is not offered chunking."""
    rank = LOSS_ORDER.index(loss) if loss in LOSS_ORDER else 0
    return list(LOSS_ORDER[rank + 1 :])


def _user_context(spec: ModelSpec, user: Workload, group: Group, **change: object) -> TrainingContext:
    """The training context of the user's own knobs in ``group`` (its first micro-batch option)
    with ``change`` (knob fields); raises InputError where the settings do not resolve."""
    knobs = Knobs(
        recompute=(user.recompute, user.recompute_every), loss=user.loss, optimizer=user.optimizer,
        offload=group.parallel.offload, micro_batch=_micro_batches(user, group.parallel)[0],
    )  # fmt: skip
    return resolve_training(spec, apply_knobs(user, group, dataclasses.replace(knobs, **change)))  # type: ignore[arg-type]


def _monotone_axis(first: T, options: Sequence[T], amounts: Callable[[T], tuple[int, ...] | None]) -> list[T]:
    """``first``, then each of ``options`` in order whose ``amounts`` are nowhere above the last kept
    option's (an option whose amounts do not resolve is kept: its estimate refuses it later)."""
    axis, last = [first], amounts(first) if options else None
    for option in options:
        here = amounts(option)
        if here is not None and last is not None and any(h > b for h, b in zip(here, last, strict=True)):
            continue
        axis.append(option)
        last = here if here is not None else last
    return axis


def _loss_bytes(spec: ModelSpec, user: Workload, group: Group, loss: LossImpl) -> tuple[int, ...] | None:
    """The logits and loss bytes of ``loss`` in ``group`` at each instant of the step (at the loss,
    kept, start of backward, kept outputs), or None where the settings do not resolve."""
    try:
        memory = loss_memory(_user_context(spec, user, group, loss=loss))
    except InputError:
        return None
    return memory.forward_end, memory.kept, memory.backward_start, memory.outputs


def loss_axis(spec: ModelSpec, user: Workload, group: Group) -> list[LossImpl]:
    """The user's loss, then each loss path of :data:`LOSS_ORDER` after it that holds no more at any
    instant of the step than the last one kept. Fused linear cross-entropy keeps ``(8 + a) h``
    bytes per token whatever the vocabulary, chunked a vocabulary's worth: with the vocabulary
    split by tensor parallelism chunking can hold less (Mixtral-8x7B, tp 8: 26 against 41 KB per
    token), and an axis must only lower the peak. Per token, so one micro-batch decides for all."""
    return _monotone_axis(user.loss, _more_saving_losses(user.loss), functools.partial(_loss_bytes, spec, user, group))


def _optimizer_bytes(spec: ModelSpec, user: Workload, group: Group, optimizer: OptimizerName) -> tuple[int, ...] | None:
    """Each stage's optimizer state and step temporaries in the allocator under ``optimizer`` in
    ``group``, then the same with its paged state (the device level), or None where the settings do
    not resolve."""
    try:
        ctx = _user_context(spec, user, group, optimizer=optimizer)
        layout = param_layout(ctx)
        stages = [stage_memory(ctx, stage, layout.targets) for stage in layout.stages]
    except InputError:
        return None
    kept = [m.states_bytes + m.step_temp_bytes + m.hook_step_bytes for m in stages]
    return (*kept, *(n + m.paged_states_bytes for n, m in zip(kept, stages, strict=True)))


def optimizer_axis(spec: ModelSpec, user: Workload, group: Group) -> list[OptimizerName]:
    """The user's optimizer, then each 8-bit one after it that holds no more on any stage than the
    last one kept. An 8-bit optimizer is not always smaller: under Trainer, bitsandbytes steps the
    embedding tables with 32-bit state, fp32 whatever the parameter dtype, while torch's AdamW keeps
    its moments in the parameters' dtype; so with bf16 weights the pipeline stage that holds the
    embedding grows (Llama-3.2-1B, pp 8, stage 0: 1.5 GB of AdamW state against 2.3 GB), and an
    axis must only lower the peak."""
    options: list[OptimizerName] = []
    if user.optimizer in ADAMW_FAMILY:
        options.extend(EIGHT_BIT)
    elif user.optimizer is OptimizerName.ADAMW_8BIT:
        options.append(OptimizerName.PAGED_ADAMW_8BIT)
    return _monotone_axis(user.optimizer, options, functools.partial(_optimizer_bytes, spec, user, group))


def knob_axes(
    spec: ModelSpec, user: Workload, group: Group, recompute: tuple[tuple[Recompute, int], ...] = RECOMPUTE_ORDER
) -> tuple[list[object], ...]:
    """The group's knob axes: recompute (one of :data:`RECOMPUTE_CHAINS` is ordered; the default,
    every setting, is not), loss (:func:`loss_axis`), optimizer, offload, micro-batch."""
    losses = loss_axis(spec, user, group)
    return (
        list(recompute),
        list(losses),
        list[object](optimizer_axis(spec, user, group)),
        list(_offloads(group.parallel)),
        list(_micro_batches(user, group.parallel)),
    )


@functools.lru_cache(maxsize=4096)
def _with_offload(parallel: Parallelism, offload: Offload) -> Parallelism:
    """``parallel`` with ``offload`` (cached: a group has at most three, built once each)."""
    return dataclasses.replace(parallel, offload=offload)


def apply_knobs(user: Workload, group: Group, knobs: Knobs) -> Workload:
    """The user's workload with a group and knob point applied (raises InputError if invalid)."""
    recompute, every = knobs.recompute
    total = per_rank_samples(user, group.parallel)
    return dataclasses.replace(
        user,
        method=group.method,
        quant=group.quant,
        precision=group.precision,
        parallel=_with_offload(group.parallel, knobs.offload),
        recompute=recompute,
        recompute_every=every if recompute is Recompute.FULL else user.recompute_every,
        loss=knobs.loss,
        optimizer=knobs.optimizer,
        batch=knobs.micro_batch,
        grad_accum=total // knobs.micro_batch,
    )
