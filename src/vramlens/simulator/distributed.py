"""FSDP2 on fake ranks: a data-parallel run on N GPUs simulated as rank 0 of a fake process group.

The route is torchtitan's memory estimator's (``scripts/estimate/estimation.py``): a
``"fake"`` process group of ``world_size = parallel.gpus`` ranks (collectives return at
once and move no data), ``fully_shard`` on the model, and the real FSDP2 code runs on fake
tensors - its all-gathers, reduce-scatters, prefetching, resharding and the buffers it
keeps for stream overlap. The tracker counts rank 0's local bytes (``DTensor`` parameters,
gradients and optimizer state through their local shards; unsharded parameters through
the storage resizes FSDP2 frees them with: :mod:`vramlens.trace._subclass`). Rank 0 holds
the largest shard of every parameter (``torch.chunk``: ``ceil(dim0 / N)`` rows), and FSDP2
pads every rank's shard to that size, so rank 0 is the busiest rank.

The wrapping is HF accelerate's FSDP2 path (the simulator runs HF Trainer's step;
``accelerate/utils/fsdp_utils.py`` ``fsdp2_prepare_model``, accelerate 1.15): every
decoder layer (the model's ``_no_split_modules``) is a unit; the input embedding its own
unit when untied; the tail (final norm and LM head, with the embedding when tied) a unit
that stays unsharded after forward; then the root. Mixed precision is what accelerate
sets for FSDP2 (``FullyShardedDataParallelPlugin.set_mixed_precision``):
``MixedPrecisionPolicy(param_dtype=half, reduce_dtype=half, output_dtype=half)`` on fp32
sharded parameters (trainable ones upcast), *and* the forward still wrapped in autocast
with outputs converted to fp32 (``Accelerator.prepare_model``, ``native_amp``); the
root's ``output_dtype`` cast then runs after that conversion. torchtitan instead reduces
in fp32 and uses no autocast; that is not what a Trainer run does.

``parallel.shard``: ``fsdp`` maps to ``reshard_after_forward=True`` (FULL_SHARD), ``hsdp``
(and ``shard_degree`` below the rank count) to a 2-D mesh, replicated across
``gpus / shard_degree`` groups of ``shard_degree`` sharding ranks. ``zero2``/``zero3`` are
refused: HF Trainer runs DeepSpeed for them (ZeRO-2 replicates parameters, which FSDP2 has
no mode for), and the estimator models DeepSpeed. ``ddp``, ``zero1``, CPU offload,
quantized bases and fused SGD are refused too. ``optimizer_in_backward`` works as on one GPU: FSDP2 calls the sharded
parameters' post-accumulate-grad hooks after each reduce-scatter (``foreach_reduce``). With ``grad_accum > 1`` the first micro-steps run without gradient
reduction, as Trainer does (``accelerator.no_sync`` -> ``set_requires_gradient_sync``), so
unsharded gradients accumulate until the last micro-step.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

from vramlens._extras import require
from vramlens.allocator.streams import Stream
from vramlens.categories import Category
from vramlens.resolve.context import TrainingContext
from vramlens.simulator.build import SimulationError, torch_dtype
from vramlens.workload.options import FsdpWrap, Method, Offload, OptimizerImpl, OptimizerName, Precision, Quant, Shard

__all__ = [
    "ShardPlan",
    "check_sharding",
    "fake_process_group",
    "fsdp_categories",
    "fsdp_streams",
    "gradient_sync",
    "shard_model",
    "shard_plan",
]

#: The shard values simulated: both are FSDP2's FULL_SHARD (layer and embedding units
#: resharded after forward); HSDP adds a replica dimension to the mesh.
_SIMULATED_SHARDS = frozenset({Shard.FSDP, Shard.HSDP})


@dataclass(frozen=True, kw_only=True)
class ShardPlan:
    """How a workload's model is sharded on its fake ranks (from its ``parallel:`` block)."""

    world_size: int
    """Data-parallel ranks (``parallel.gpus``; tp = pp = cp = ep = 1)."""
    shard_degree: int
    """Ranks one copy of the parameters is sharded over (``shard_degree``, else all ranks)."""
    precision: Precision
    """The workload's precision; mixed: fp32 sharded parameters, half all-gathers and reductions."""

    @property
    def replicas(self) -> int:
        """Copies of the sharded state (HSDP's replicate dimension; 1 for plain FSDP)."""
        return self.world_size // self.shard_degree


def _refusal(ctx: TrainingContext) -> tuple[str, str] | None:
    """(key, what) of the first multi-GPU setting the simulator cannot run, or None."""
    workload, parallel = ctx.workload, ctx.workload.parallel
    if parallel.shard not in _SIMULATED_SHARDS:
        return (
            "parallel.shard",
            f"'{parallel.shard}' (it runs FSDP2: fsdp and hsdp; DeepSpeed ZeRO and DDP are estimated)",
        )
    if workload.fsdp_wrap is FsdpWrap.ROOT:
        return "fsdp_wrap", "'root' (FSDP1's root unit; it runs accelerate's FSDP2 units, fsdp_wrap split)"
    if parallel.offload is not Offload.NONE:
        return "parallel.offload", f"'{parallel.offload}' (CPU offload is estimated, not simulated)"
    if workload.quant is not Quant.NONE or workload.method is Method.QLORA:
        return "quant", f"'{workload.quant}' with FSDP2 (quantized bases are simulated on one GPU only)"
    if workload.optimizer is OptimizerName.SGD and ctx.optimizer_impl is OptimizerImpl.FUSED:
        return (
            "optimizer_impl",
            "fused SGD with FSDP2 (torch has no DTensor rule for aten._fused_sgd_; a real run fails too)",
        )
    return None


def check_sharding(ctx: TrainingContext) -> None:
    """Refuse, in one line naming the key, a multi-GPU workload FSDP2 on fake ranks cannot run."""
    if ctx.workload.parallel.gpus == 1:
        return
    refused = _refusal(ctx)
    if refused is not None:
        key, what = refused
        raise SimulationError(
            f"{key}: the simulator runs data-parallel training as FSDP2 on fake ranks and cannot run {what}; "
            "use `vramlens estimate` for this workload"
        )


def shard_plan(ctx: TrainingContext) -> ShardPlan | None:
    """The sharding of a workload (None on one GPU); call :func:`check_sharding` first."""
    parallel = ctx.workload.parallel
    if parallel.gpus == 1:
        return None
    return ShardPlan(
        world_size=parallel.gpus,
        shard_degree=parallel.shard_group,
        precision=ctx.workload.precision,
    )


@contextlib.contextmanager
def fake_process_group(plan: ShardPlan | None) -> Iterator[None]:
    """A fake ``torch.distributed`` process group of ``plan.world_size`` ranks (this process is
    rank 0) for the block, destroyed on the way out whatever happens; nothing without a plan.

    Refuses to run beside an existing process group (it would be replaced). Source:
    ``torch.testing._internal.distributed.fake_pg`` registers the ``"fake"`` backend.
    """
    if plan is None:
        yield
        return
    dist = require("torch.distributed", purpose="vramlens simulate (several GPUs)")
    if not dist.is_available():
        raise SimulationError("parallel.gpus: this torch build has no torch.distributed; use `vramlens estimate`")
    if dist.is_initialized():
        raise SimulationError(
            "parallel.gpus: a torch.distributed process group already exists in this process; simulate several "
            "GPUs in a process without one, or use `vramlens estimate`"
        )
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=plan.world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _mesh(plan: ShardPlan) -> Any:
    """The device mesh (built outside fake mode: it reads rank ids): 1-D of the shard ranks,
    or 2-D (replicate, shard) for HSDP."""
    device_mesh = require("torch.distributed.device_mesh", purpose="vramlens simulate (several GPUs)")
    if plan.replicas == 1:
        return device_mesh.init_device_mesh("cpu", (plan.world_size,), mesh_dim_names=("dp_shard",))
    shape = (plan.replicas, plan.shard_degree)
    return device_mesh.init_device_mesh("cpu", shape, mesh_dim_names=("dp_replicate", "dp_shard"))


def _units(model: Any) -> tuple[list[Any], Any, list[Any]]:
    """accelerate's FSDP2 units: the decoder layers, the untied input embedding (or None) and
    the tail (final norm, LM head, the embedding when tied), in ``fsdp2_prepare_model``'s order."""
    classes = set(getattr(model, "_no_split_modules", None) or [])
    layers = [module for module in model.modules() if type(module).__name__ in classes]
    embed = getattr(model, "get_input_embeddings", lambda: None)()
    head = getattr(model, "get_output_embeddings", lambda: None)()
    tied = embed is not None and head is not None and getattr(embed, "weight", None) is getattr(head, "weight", 0)
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else model
    norms = [child for child in base.children() if "Norm" in type(child).__name__] if base is not None else []
    tail = [m for m in (norms[-1] if norms else None, embed if tied else None, head) if m is not None]
    return layers, (None if tied else embed), tail


def shard_model(model: Any, plan: ShardPlan, *, fake_mode: Any, total_layers: int | None = None) -> list[str]:
    """Apply FSDP2 to the (fake, materialized) model as accelerate does; returns the notes
    (``total_layers``: the full model's decoder layers, for a model cut for replay)."""
    torch = require("torch", purpose="vramlens simulate")
    fsdp = require("torch.distributed.fsdp", purpose="vramlens simulate (several GPUs)")
    half = torch_dtype(plan.precision, 2)
    mixed = plan.precision.mixed
    policy = fsdp.MixedPrecisionPolicy(param_dtype=half, reduce_dtype=half, output_dtype=half) if mixed else None
    options = {"mesh": _mesh(plan), "mp_policy": policy or fsdp.MixedPrecisionPolicy()}
    layers, embed, tail = _units(model)
    if not layers:
        raise SimulationError(
            f"model: {type(model).__name__} names no decoder-layer class (_no_split_modules) to shard; "
            "use `vramlens estimate`"
        )
    with fake_mode, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for unit in [*layers, *([embed] if embed is not None else [])]:
            fsdp.fully_shard(unit, reshard_after_forward=True, **options)
        if tail:
            fsdp.fully_shard(tail, reshard_after_forward=False, **options)
        fsdp.fully_shard(model, **options)
    if mixed:
        _accelerate_forward(torch, model, half)
    return _notes(plan, total_layers or len(layers))


def _accelerate_forward(torch: Any, model: Any, half: Any) -> None:
    """Wrap the model's forward as ``Accelerator.prepare_model`` does with ``native_amp``:
    autocast to ``half`` inside, half-precision outputs converted to fp32 (``convert_outputs_to_fp32``).
    FSDP2's hooks run around it, so the root's ``output_dtype`` cast comes last."""
    forward = model.forward

    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", dtype=half):
            out = forward(*args, **kwargs)
        for key, value in list(out.items()):
            if isinstance(value, torch.Tensor) and value.dtype in (torch.bfloat16, torch.float16):
                out[key] = value.float()
        return out

    model.forward = wrapped


def _notes(plan: ShardPlan, layers: int) -> list[str]:
    """The report's assumptions about the sharding."""
    mesh = f"{plan.replicas} x {plan.shard_degree} (HSDP)" if plan.replicas > 1 else f"{plan.world_size}"
    mixed = (
        f"MixedPrecisionPolicy(param/reduce/output {_half_name(plan.precision)}) on fp32 shards, forward in autocast "
        "(accelerate)"
        if plan.precision.mixed
        else "no mixed-precision policy"
    )
    return [
        f"FSDP2 on {plan.world_size} fake ranks (mesh {mesh}), rank 0 reported: {layers} decoder layers, "
        "the embedding (when untied), the tail (final norm + LM head, not resharded), then the root as units "
        "(accelerate's wrapping); "
        f"layers and embedding resharded after forward; {mixed}",
        "FSDP2: all-gathered parameters count as temporary, sharded ones as parameters",
    ]


def _half_name(precision: Precision) -> str:
    """The half-precision dtype name of a precision (bf16 or fp16)."""
    return "fp16" if precision in (Precision.FP16, Precision.MIXED_FP16) else "bf16"


def _relabel_after(method: Any, pick: Any, tracker: Any, category: Category) -> Any:
    """``method`` followed by re-labelling the tensors ``pick(self)`` names."""

    @functools.wraps(method)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        tracker.set_category(pick(self), category)
        return result

    return wrapped


def _gathered(group: Any) -> list[Any]:
    """A param group's all-gather buffers: each parameter's unsharded data and the flat
    all-gather output FSDP keeps for overlap (``comm_ctx.all_gather_state``)."""
    found = [
        tensor
        for param in group.fsdp_params
        for tensor in (*getattr(param, "all_gather_outputs", ()), *getattr(param, "_unsharded_inner_tensors", ()))
    ]
    state = getattr(group.comm_ctx, "all_gather_state", None)
    if state is not None:
        found.append(state.all_gather_result.all_gather_output)
    return found


def _held_gradients(group: Any) -> list[Any]:
    """Unsharded gradients a param group keeps after its backward (no gradient sync)."""
    found = []
    for param in group.fsdp_params:
        found.append(getattr(param, "unsharded_accumulated_grad", None))
        unsharded = getattr(param, "_unsharded_param", None)
        found.append(unsharded.grad if unsharded is not None else None)
    return [grad for grad in found if grad is not None]


@contextlib.contextmanager
def fsdp_categories(tracker: Any) -> Iterator[None]:
    """Label FSDP2's storages for the block: all-gathered parameters ``temporary`` (after each
    ``wait_for_unshard``; the tracker would call those made in a forward hook activations),
    unsharded gradients kept without gradient sync ``gradients`` (after ``post_backward``).
    Sharded gradients and optimizer state get their labels from the tracker's optimizer hooks."""
    group_module = require("torch.distributed.fsdp._fully_shard._fsdp_param_group", purpose="vramlens simulate")
    group = group_module.FSDPParamGroup
    unshard = _relabel_after(group.wait_for_unshard, _gathered, tracker, Category.TEMPORARY)
    post_backward = _relabel_after(group.post_backward, _held_gradients, tracker, Category.GRADIENTS)
    with (
        mock.patch.object(group, "wait_for_unshard", unshard),
        mock.patch.object(group, "post_backward", post_backward),
    ):
        yield


#: FSDP2's streams (``FSDPCommContext.lazy_init``, ``_fsdp_param_group.py``) and their ids.
_COMM_STREAMS = {
    "all_gather_copy_in_stream": Stream.ALL_GATHER,
    "all_gather_stream": Stream.ALL_GATHER_COMM,
    "reduce_scatter_stream": Stream.REDUCE_SCATTER,
    "all_reduce_stream": Stream.ALL_REDUCE,
}


@contextlib.contextmanager
def fsdp_streams(tracker: Any) -> Iterator[None]:
    """Record, for the block, the stream each storage is allocated on, as a CUDA run would: FSDP2
    enters its collectives' streams with ``device_handle.stream(...)`` (``foreach_all_gather``,
    ``foreach_reduce`` in ``_fsdp_collectives.py``); on CPU that is ``torch.cpu.stream``, a no-op
    context that this wraps to set ``tracker.stream`` to the id of the stream entered (from the
    streams ``FSDPCommContext.lazy_init`` made; any other stream is the default one). The replay
    then keeps each stream's freed blocks apart (:mod:`vramlens.allocator.streams`)."""
    torch = require("torch", purpose="vramlens simulate")
    group_module = require("torch.distributed.fsdp._fully_shard._fsdp_param_group", purpose="vramlens simulate")
    context_class = group_module.FSDPCommContext
    known: dict[int, Stream] = {}
    lazy_init, enter_stream = context_class.lazy_init, torch.cpu.stream

    @functools.wraps(lazy_init)
    def recording_lazy_init(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = lazy_init(self, *args, **kwargs)
        for name, stream in _COMM_STREAMS.items():
            found = getattr(self, name, None)
            if found is not None:
                known[id(found)] = stream
        return result

    @contextlib.contextmanager
    def entered(stream: Any) -> Iterator[None]:
        previous = tracker.stream
        tracker.stream = known.get(id(stream), Stream.DEFAULT)
        try:
            with enter_stream(stream):
                yield
        finally:
            tracker.stream = previous

    with (
        mock.patch.object(context_class, "lazy_init", recording_lazy_init),
        mock.patch.object(torch.cpu, "stream", entered),
    ):
        yield


def gradient_sync(model: Any, plan: ShardPlan | None, *, last: bool) -> contextlib.AbstractContextManager[None]:
    """Trainer's gradient-accumulation context for one micro-step: FSDP2 reduces gradients only
    on the ``last`` micro-step (``accelerator.no_sync`` -> ``set_requires_gradient_sync(False)``)."""
    if plan is None or last:
        return contextlib.nullcontext()
    return _no_sync(model)


@contextlib.contextmanager
def _no_sync(model: Any) -> Iterator[None]:
    """No reduce-scatter in the block (FSDP2's ``set_requires_gradient_sync``, every unit)."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
