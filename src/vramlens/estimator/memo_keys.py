"""Memo keys: frozen records of everything a memoized quantity reads from a context besides the model."""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.resolve.context import TrainingContext
from vramlens.resolve.kbit import kbit_prepared
from vramlens.workload.options import Method, Quant

__all__ = ["LayoutInputs"]


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
