"""Whether a workload trains LoRA over a bitsandbytes 4-bit base, and whether PEFT's k-bit
preparation runs on it: part of resolving a workload (the sources are in
:mod:`vramlens.estimator.qlora`, which holds the memory terms of QLoRA)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vramlens.model.quant_formats import bnb_4bit_quants
from vramlens.workload.options import Method, Quant, Shard

if TYPE_CHECKING:
    from vramlens.resolve.frameworks import FrameworkProfile
    from vramlens.workload.spec import Workload

__all__ = ["BNB_4BIT_QUANTS", "FP32", "bnb_4bit_base", "kbit_notes", "kbit_prepared", "prepared_compute_bytes"]

#: Workload ``quant`` values stored by bitsandbytes' 4-bit linears (``method: qlora`` without a
#: ``quant`` means nf4-dq, the QLoRA paper's setting).
BNB_4BIT_QUANTS = bnb_4bit_quants()
#: Sharding that stores the 4-bit weights in bf16 flat parameters and skips the preparation (TRL).
_SHARDED = frozenset({Shard.FSDP, Shard.HSDP, Shard.ZERO3})
FP32 = 4


def bnb_4bit_base(workload: Workload) -> bool:
    """LoRA adapters over a bitsandbytes 4-bit base: ``method: qlora`` with ``quant`` none, nf4
    or nf4-dq, or ``method: lora`` with ``quant`` nf4 or nf4-dq."""
    if workload.method is Method.QLORA:
        return workload.quant is Quant.NONE or workload.quant in BNB_4BIT_QUANTS
    return workload.method is Method.LORA and workload.quant in BNB_4BIT_QUANTS


def kbit_prepared(workload: Workload, profile: FrameworkProfile) -> bool:
    """Whether ``peft.prepare_model_for_kbit_training`` runs: a bitsandbytes 4-bit base under a
    framework whose QLoRA recipe calls it (``hf``), unless the weights are sharded
    (FSDP/HSDP/ZeRO-3), where TRL skips it."""
    return profile.kbit_prepare and bnb_4bit_base(workload) and workload.parallel.shard not in _SHARDED


def kbit_notes(workload: Workload, profile: FrameworkProfile) -> list[str]:
    """The assumption the estimate reports for a bitsandbytes 4-bit base."""
    if not bnb_4bit_base(workload):
        return []
    if kbit_prepared(workload, profile):
        return [
            "qlora: peft.prepare_model_for_kbit_training assumed (PEFT/transformers QLoRA guides, QLoRA "
            "paper, TRL <= 0.26): embeddings, norms, LM head, biases and MoE experts in fp32, so the "
            "residual stream and the 4-bit linears' outputs are fp32 (TRL 0.27+ skips it: less memory)"
        ]
    return [
        "qlora: no k-bit preparation (TRL skips it for FSDP/ZeRO-3 QLoRA; frameworks other than hf do not "
        "run it): the unquantized weights stay in the model dtype"
    ]


def prepared_compute_bytes(workload: Workload, profile: FrameworkProfile, *, compute: int, autocast: bool) -> int:
    """Bytes per element of activations: ``compute``, except that a k-bit-prepared model run
    without autocast (``precision: bf16|fp16``) computes everything outside the 4-bit matmuls
    in its fp32 weights' dtype (4)."""
    return FP32 if kbit_prepared(workload, profile) and not autocast else compute
