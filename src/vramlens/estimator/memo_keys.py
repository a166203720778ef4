"""Memo keys: frozen records of everything a memoized quantity reads from a context besides the model."""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter

from vramlens.resolve.context import TrainingContext
from vramlens.resolve.kbit import kbit_prepared
from vramlens.workload.options import Method, Quant
from vramlens.workload.spec import Workload

__all__ = ["SIZE_KEYS", "LayoutInputs", "SizeFreeInputs"]

#: The workload keys a planner varies from one estimate to the next (and the model, which the
#: memo is held by, and the GPU, which an estimate only compares with).
SIZE_KEYS = frozenset({"model", "gpu", "batch", "seq"})
_SIZE_FREE_KEYS = tuple(f.name for f in fields(Workload) if f.name not in SIZE_KEYS)
_size_free_values = attrgetter(*_SIZE_FREE_KEYS)


@dataclass(frozen=True, kw_only=True, slots=True)
class LayoutInputs:
    """What the parameter layout reads from a training context besides the model: its memo key."""

    method: Method
    lora_rank: int
    lora_targets: str | tuple[str, ...]
    modules_to_save: tuple[str, ...]
    quant: Quant
    param_bytes: int
    frozen_bytes: float
    grad_bytes: int
    state_bytes: int
    master_bytes: int
    compute_bytes: int
    adapters_fp32: bool
    tp: int
    pp: int
    ep: int
    kbit_prepared: bool

    @classmethod
    def of(cls, ctx: TrainingContext) -> LayoutInputs:
        workload, lora, parallel = ctx.workload, ctx.workload.lora, ctx.workload.parallel
        return cls(
            method=workload.method, lora_rank=lora.rank, lora_targets=lora.targets,
            modules_to_save=lora.modules_to_save, quant=workload.quant, param_bytes=ctx.param_bytes,
            frozen_bytes=ctx.frozen_bytes, grad_bytes=ctx.grad_bytes, state_bytes=ctx.state_bytes,
            master_bytes=ctx.master_bytes, compute_bytes=ctx.compute_bytes, adapters_fp32=ctx.profile.adapters_fp32,
            tp=parallel.tp, pp=parallel.pp, ep=parallel.ep, kbit_prepared=kbit_prepared(workload, ctx.profile),
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class SizeFreeInputs:
    """The memo key of a part of a training estimate that reads neither batch nor sequence length
    (nor tokens): the part's name, the pipeline stage and every other workload key, in the order of
    :class:`~vramlens.workload.spec.Workload`'s fields (so a key added to the workload is in it)."""

    part: str
    stage: str
    workload: tuple[object, ...]

    @staticmethod
    def workload_keys(workload: Workload) -> tuple[object, ...]:
        """Every workload key but :data:`SIZE_KEYS`."""
        return _size_free_values(workload)
