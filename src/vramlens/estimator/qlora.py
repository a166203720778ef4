"""QLoRA on a bitsandbytes 4-bit base: what differs from LoRA on a bf16 base.

The QLoRA recipe of PEFT's and transformers' guides, the QLoRA paper's ``qlora.py`` and
TRL's ``SFTTrainer`` (up to 0.26, unsharded) loads the base with ``load_in_4bit`` and runs
``peft.prepare_model_for_kbit_training`` before ``get_peft_model``. Read for this module
(bitsandbytes 0.49, peft 0.21, transformers 5.x, TRL):

* ``prepare_model_for_kbit_training`` (``peft/utils/other.py``) casts every fp16/bf16
  parameter that is not ``Params4bit`` to fp32: embeddings, norms, the LM head, biases and
  the 3-D MoE experts that ``replace_with_bnb_linear`` leaves alone (it converts only
  ``nn.Linear``). The embedding output, hence the residual stream and every checkpoint, is
  then fp32, and so are the outputs of the 4-bit linears.
* ``bnb.nn.Linear4bit.forward`` casts its input to ``bnb_4bit_compute_dtype`` and its output
  back to the input's dtype; ``MatMul4Bit`` saves no tensor per token.
* PEFT's ``lora/bnb.py`` ``Linear4bit.forward`` casts the adapter input only when autocast is
  off, so under autocast ``lora_A`` keeps the input itself (or, for an fp32 input, its own
  bf16 autocast cast); standard LoRA layers cast to the adapter dtype, a copy per adapter.
* Under autocast the fp32 LM head's bf16 weight copy is made per call (autocast caches casts
  of leaves that require grad only) and kept by the matmul for the input gradient.
* The preparation casts one parameter at a time (``param.data = param.data.to(torch.float32)``),
  so while it casts a weight the loaded (bf16/fp16) tensor and its fp32 copy are both alive:
  the load's high point is every weight already in its final dtype plus the largest
  unquantized weight in the loaded dtype (:func:`prepare_cast_bytes`). With a short sequence
  that is above the training step's peak (the loaded vocabulary table beside everything else).
* TRL skips the preparation for sharded QLoRA ("one should never call ...
  prepare_model_for_kbit_training when doing QLoRA + FSDP / DS-Zero3", trl#1416), whose
  4-bit weights are stored as bf16 (``bnb_4bit_quant_storage``), and TRL 0.27+ (trl#4577)
  always; the workload has no key for this, so the framework profile decides
  (:attr:`FrameworkProfile.kbit_prepare`) and the estimate says so in its assumptions.

The simulator (:mod:`vramlens.simulator.quant`) runs the same recipe.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from vramlens.resolve.kbit import FP32, bnb_4bit_base, kbit_prepared
from vramlens.workload.options import Precision

if TYPE_CHECKING:
    from vramlens.estimator.logits import LogitsMemory
    from vramlens.resolve.context import TrainingContext

__all__ = [
    "adapter_inputs_shared",
    "base_output_bytes",
    "dequantized_bytes",
    "head_weight_cast_bytes",
    "prepare_cast_bytes",
    "unquantized_bytes",
    "with_head_weight_cast",
]


def unquantized_bytes(ctx: TrainingContext) -> float:
    """Bytes per element of frozen weights bitsandbytes leaves unquantized (embeddings, norms,
    LM head, biases, 3-D MoE experts): fp32 after k-bit preparation, else the frozen dtype."""
    return FP32 if kbit_prepared(ctx.workload, ctx.profile) else ctx.frozen_bytes


def dequantized_bytes(ctx: TrainingContext) -> int:
    """Bytes per element of a dequantized base weight: the dtype the model was loaded in
    (``bnb_4bit_compute_dtype``), bf16/fp16 unless ``precision: fp32``."""
    return FP32 if ctx.workload.precision is Precision.FP32 else 2


def adapter_inputs_shared(ctx: TrainingContext) -> bool:
    """Adapters read their input uncast and keep it once per input tensor: PEFT's 4-bit LoRA
    forward without lora dropout (dropout makes a dropped copy per adapter), under autocast
    or when the input already has the adapters' dtype (else PEFT casts it, a copy per
    adapter, as standard LoRA does)."""
    if not ctx.profile.adapters_fp32:  # not PEFT (whose adapters are fp32): the framework's own LoRA layers
        return False
    same_dtype = ctx.autocast or ctx.compute_bytes == FP32
    return bnb_4bit_base(ctx.workload) and ctx.workload.lora.dropout == 0 and same_dtype


def base_output_bytes(ctx: TrainingContext) -> int:
    """Bytes per element of a frozen 4-bit linear's output when it is not the compute dtype:
    ``Linear4bit`` returns its input's dtype, fp32 on a k-bit-prepared model (0 otherwise:
    the compute dtype)."""
    return FP32 if kbit_prepared(ctx.workload, ctx.profile) and ctx.compute_bytes != FP32 else 0


def with_head_weight_cast(logits: LogitsMemory, cast: int) -> tuple[LogitsMemory, int]:
    """``logits`` with the LM head's bf16 weight copy of ``cast`` bytes (:func:`head_weight_cast_bytes`)
    added where it is alive: at the loss, between forward and backward, and while the loss gradient
    is formed (it is freed by the head's backward, before the layers'); and its bytes."""
    if not cast:
        return logits, 0
    kept = replace(
        logits,
        forward_end=logits.forward_end + cast,
        kept=logits.kept + cast,
        backward_start=logits.backward_start + cast,
    )
    return kept, cast


def head_weight_cast_bytes(ctx: TrainingContext, vocab: int) -> int:
    """Bytes of the bf16 copy autocast makes of a k-bit-prepared (fp32, frozen) LM head:
    ``vocab x hidden x compute bytes`` (``vocab`` on this rank), kept from the head's forward
    to its backward (the first op of backward). 0 without preparation or autocast."""
    if not (ctx.autocast and kbit_prepared(ctx.workload, ctx.profile)):
        return 0
    return vocab * ctx.spec.hidden_size * ctx.compute_bytes


def prepare_cast_bytes(ctx: TrainingContext) -> int:
    """Bytes of the largest weight ``prepare_model_for_kbit_training`` casts to fp32, in the dtype
    it was loaded in: alive beside its fp32 copy during the cast (``param.data =
    param.data.to(torch.float32)``, one parameter at a time, peft/utils/other.py). The largest
    unquantized weight is the vocabulary table (embedding or LM head, ``vocab / tp x hidden``) or,
    on a MoE model, one fused 3-D expert tensor (transformers 5's ``gate_up_proj``, ``experts / ep x
    2 x expert intermediate x hidden``; bitsandbytes converts ``nn.Linear`` only). 0 without the
    preparation or when the weights were loaded in fp32 (the loaded dtype: :func:`dequantized_bytes`)."""
    loaded = dequantized_bytes(ctx)
    if not kbit_prepared(ctx.workload, ctx.profile) or loaded >= FP32:
        return 0
    spec, parallel = ctx.spec, ctx.workload.parallel
    largest = spec.vocab_size // parallel.tp * spec.hidden_size
    if spec.moe is not None:
        experts = spec.moe.num_experts // parallel.ep * 2 * spec.moe.expert_intermediate_size * spec.hidden_size
        largest = max(largest, experts // parallel.tp)
    return largest * loaded
