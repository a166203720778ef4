"""The enumerated values of the workload contract (``shared/docs/WORKLOAD.md``).

Each policy is a ``StrEnum`` whose values are exactly the strings the contract
lists; the docstring of each member says what it means for memory.
"""

from __future__ import annotations

from vramlens._compat import StrEnum
from vramlens.model.quant_formats import Quant

__all__ = [
    "AttentionImpl",
    "Engine",
    "Framework",
    "FsdpWrap",
    "Kernels",
    "KvDtype",
    "LossImpl",
    "Method",
    "Mode",
    "Offload",
    "OptimizerImpl",
    "OptimizerName",
    "PipelineSchedule",
    "Precision",
    "Quant",
    "Recompute",
    "Shard",
]


class Mode(StrEnum):
    TRAIN = "train"
    """Training or fine-tuning: weights, gradients, optimizer state, activations."""
    INFER = "infer"
    """Inference / serving: weights, KV cache, prefill activations."""


class Framework(StrEnum):
    AUTO = "auto"
    """Pick the usual stack for the mode (hf for training, vllm/hf for inference) and say so."""
    HF = "hf"
    TRL = "trl"
    """TRL's trainers (SFTTrainer, DPOTrainer): transformers' Trainer with TRL's fused LM head."""
    PLAIN = "plain"
    """A hand-written PyTorch loop over a transformers model (seed 002's): torch's defaults, nothing fused."""
    TORCHTITAN = "torchtitan"
    TORCHTUNE = "torchtune"
    LITGPT = "litgpt"
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    VLLM = "vllm"


class Method(StrEnum):
    FULL = "full"
    """Every parameter is trained."""
    LORA = "lora"
    """Frozen base at the compute dtype, trainable low-rank adapters."""
    QLORA = "qlora"
    """Frozen base quantized (NF4 by default), trainable adapters."""
    FREEZE = "freeze"
    """Only ``lora.modules_to_save`` (e.g. embeddings, head) are trained; the rest is frozen."""


class Precision(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    """Pure bf16: weights, gradients and optimizer states in bf16."""
    FP16 = "fp16"
    MIXED_BF16 = "mixed-bf16"
    """fp32 master weights with bf16 compute (autocast or FSDP mixed precision)."""
    MIXED_FP16 = "mixed-fp16"

    @property
    def mixed(self) -> bool:
        """True for the mixed policies (fp32 master weights)."""
        return self in (Precision.MIXED_BF16, Precision.MIXED_FP16)


class OptimizerName(StrEnum):
    ADAMW = "adamw"
    ADAMW_8BIT = "adamw-8bit"
    PAGED_ADAMW = "paged-adamw"
    PAGED_ADAMW_8BIT = "paged-adamw-8bit"
    ADAFACTOR = "adafactor"
    SGD = "sgd"
    LION = "lion"


class OptimizerImpl(StrEnum):
    AUTO = "auto"
    PER_TENSOR = "per-tensor"
    """A Python loop over parameters: step temporaries of one tensor at a time."""
    FOREACH = "foreach"
    """Multi-tensor kernels: step temporaries as large as all parameters of a dtype group."""
    FUSED = "fused"
    """One fused kernel: no step temporaries."""


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    """Recompute the cheap, memory-heavy ops (attention core, activations) and keep matmul outputs."""
    FULL = "full"
    """Keep only each checkpointed layer's input; recompute the layer in backward."""
    OFFLOAD = "offload"
    """Checkpointed layer inputs are offloaded to CPU memory."""

    @property
    def whole_layer(self) -> bool:
        """Each checkpointed layer is re-run whole in backward (full recompute, or its input offloaded)."""
        return self in (Recompute.FULL, Recompute.OFFLOAD)


class AttentionImpl(StrEnum):
    AUTO = "auto"
    FLASH = "flash"
    """FlashAttention: O(s) saved state (output and log-sum-exp)."""
    EFFICIENT = "efficient"
    """Memory-efficient SDPA kernel: O(s) saved state."""
    SDPA = "sdpa"
    """torch SDPA with its default kernel choice (flash when possible)."""
    EAGER = "eager"
    """Explicit softmax(QK^T)V: the s^2 scores and probabilities are saved."""


class LossImpl(StrEnum):
    AUTO = "auto"
    FULL = "full"
    """Full [batch, seq, vocab] logits, up-cast to fp32 for cross-entropy."""
    CHUNKED = "chunked"
    """Cross-entropy over sequence chunks (torchtune): one chunk of fp32 logits at a time."""
    FUSED_LINEAR = "fused-linear"
    """Fused linear + cross-entropy (Liger, Apple CCE): logits never materialized in full."""
    CHUNKED_LOGPROB = "chunked-logprob"
    """TRL's fused LM head (trl/kernels/chunked_logprob.py): per-token log-probabilities over
    4096-token x 32768-vocabulary tiles; the logits never exist in full."""


class Kernels(StrEnum):
    """Whose kernels run the model's layers (training). Added to the v1 contract by vramlens."""

    EAGER = "eager"
    """The framework's own modules (transformers' eager RMSNorm, MLP and rotary code)."""
    LIGER = "liger"
    """Liger-Kernel as ``use_liger_kernel=True`` applies it (``_apply_liger_kernel_to_instance``):
    its RMSNorm and SwiGLU/GeGLU autograd functions keep less for backward, its RoPE rotates in
    place, and ``loss: auto`` becomes its fused linear cross-entropy (:mod:`vramlens.resolve.kernels`)."""


class Shard(StrEnum):
    NONE = "none"
    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"
    FSDP = "fsdp"
    HSDP = "hsdp"


class FsdpWrap(StrEnum):
    """Which FSDP units a model is wrapped into (``shard: fsdp | hsdp``). Added to the v1 contract by vramlens."""

    AUTO = "auto"
    """The framework's own wrapping (``hf``, ``torchtitan``: split; the others: root)."""
    ROOT = "root"
    """Each decoder layer a unit; the embedding, final norm and head stay in the root unit, which is
    kept all-gathered from forward to backward (FSDP1, which HF Trainer ran before transformers 5;
    FSDP2 with the root left alone, as torchtitan wrapped before 2025-07-28)."""
    SPLIT = "split"
    """The embedding and the final norm + head are units of their own: the embedding is resharded
    after forward, the head kept gathered into backward (accelerate's FSDP2 path, HF Trainer's
    default since transformers 5; torchtitan since 2025-07-28)."""


class PipelineSchedule(StrEnum):
    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"
    INTERLEAVED_1F1B = "interleaved-1f1b"


class Offload(StrEnum):
    NONE = "none"
    OPTIMIZER = "optimizer"
    """Optimizer states (and the master copy) live in CPU memory; the step runs on CPU."""
    OPTIMIZER_PARAMS = "optimizer+params"
    """Parameters too: sharded parameters are fetched to the GPU when needed."""


class KvDtype(StrEnum):
    AUTO = "auto"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


class Engine(StrEnum):
    HF = "hf"
    VLLM = "vllm"
