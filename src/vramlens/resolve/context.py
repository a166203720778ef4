"""``TrainingContext``: a workload resolved against its model and framework, once per estimate.

Every term function reads this object, so "what is trainable, in which dtype,
split how many ways" is decided in exactly one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens._records import replacer
from vramlens.errors import InputError
from vramlens.model.quant_formats import qlora_bases
from vramlens.model.spec import ModelSpec
from vramlens.resolve._memo import memo
from vramlens.resolve.attention import CudaAttention, hf_attention_kernel, on_cuda_backend
from vramlens.resolve.frameworks import PLAIN_NOTE, FrameworkProfile, MixedStyle, profile_for
from vramlens.resolve.kbit import kbit_notes, prepared_compute_bytes
from vramlens.resolve.kernels import check_kernels, liger_loss
from vramlens.resolve.zero import ZeroSettings, zero_settings
from vramlens.workload.options import (
    AttentionImpl,
    Framework,
    Kernels,
    LossImpl,
    Method,
    OptimizerImpl,
    Precision,
    Quant,
    Shard,
)
from vramlens.workload.spec import Workload
from vramlens.workload.versions import older_than, rule_note

__all__ = ["TrainingContext", "check_head_split", "resize_training", "resolve_training"]

_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingContext:
    """Resolved settings of one training workload on one rank."""

    spec: ModelSpec
    workload: Workload
    profile: FrameworkProfile
    param_bytes: int
    """Bytes per element of the resident (possibly sharded) trainable weights."""
    frozen_bytes: float
    """Bytes per element of frozen base weights (0.5 + scales for 4-bit, handled in weights.py)."""
    compute_bytes: int
    """Bytes per element of activations (2 for bf16/fp16 compute, 4 for fp32)."""
    grad_bytes: int
    """Bytes per element of gradients of trainable parameters."""
    state_bytes: int
    """Bytes per element of optimizer moments (AdamW keeps them in the parameter dtype)."""
    master_bytes: int
    """Bytes per element of a separate fp32 master copy (0 when the parameters are the master)."""
    autocast: bool
    """fp32 weights computed in bf16/fp16 by torch.autocast (weight casts are kept for backward)."""
    attention: AttentionImpl
    math_unmasked: bool = False
    """SDPA runs its math backend in the attention layers no mask reaches (fp32 queries, grouped KV
    heads) while the sliding or chunked layers run a fused kernel: those layers count as eager
    attention (:attr:`vramlens.resolve.attention.CudaAttention.math_unmasked`)."""
    loss: LossImpl
    compiled_loss: bool
    """torch.compile fuses the cross-entropy (``compile: true``, ``loss: auto``, a framework that compiles its loss)."""
    optimizer_impl: OptimizerImpl
    tokens: int
    """Tokens per micro-batch on this rank: batch x seq / cp."""
    shard_group: int
    """Ranks sharing one copy of sharded state (1 when nothing is sharded)."""
    assumptions: tuple[str, ...]
    zero: ZeroSettings | None = None
    """DeepSpeed ZeRO's bucket and ZeRO-3 coordinator sizes (``shard: zero1-3``; :mod:`vramlens.resolve.zero`)."""

    @property
    def method(self) -> Method:
        return self.workload.method

    @property
    def in_backward_step(self) -> bool:
        """Gradients are stepped and freed one by one during backward. Not under a whole-model
        torch.compile, whose compiled backward returns every gradient at once; a framework that
        compiles each layer on its own (torchtune) still frees them layer by layer."""
        whole_model_compile = self.workload.compile and not self.profile.compiles_per_layer
        return self.workload.optimizer_in_backward and not whole_model_compile

    @property
    def full(self) -> bool:
        """Every parameter is trained."""
        return self.workload.method is Method.FULL


def _dtypes(precision: Precision, profile: FrameworkProfile, *, sharded_params: bool) -> dict[str, int | bool]:
    """Element sizes of params / compute / grads / states / master copy for a precision policy."""
    if precision is Precision.FP32:
        return {"param": 4, "compute": 4, "grad": 4, "state": 4, "master": 0, "autocast": False}
    if precision in (Precision.BF16, Precision.FP16):
        return {"param": 2, "compute": 2, "grad": 2, "state": 2, "master": 0, "autocast": False}
    if profile.mixed is MixedStyle.AUTOCAST and not sharded_params:
        return {"param": 4, "compute": 2, "grad": 4, "state": 4, "master": 0, "autocast": True}
    if profile.mixed is MixedStyle.AUTOCAST:
        # FSDP/ZeRO-3 under accelerate: fp32 flat parameters, bf16 all-gathered compute parameters.
        return {"param": 4, "compute": 2, "grad": 4, "state": 4, "master": 0, "autocast": False}
    if profile.mixed is MixedStyle.FSDP_PARAM_DTYPE:
        return {"param": 4, "compute": 2, "grad": 4, "state": 4, "master": 0, "autocast": False}
    return {"param": 2, "compute": 2, "grad": 2, "state": 4, "master": 4, "autocast": False}


def _attention(
    workload: Workload, profile: FrameworkProfile, spec: ModelSpec, notes: list[str], *, compute_bytes: int
) -> CudaAttention:
    """The kernel: the workload's, or the framework's default for ``auto``; under HF, what
    transformers runs for the family, as CUDA runs it (SDPA's math backend: eager attention in the
    layers that run it; :mod:`vramlens.resolve.attention`)."""
    resolved = workload.attention
    if resolved is AttentionImpl.AUTO:
        resolved = profile.attention
    note = ""
    # transformers models: what transformers runs
    transformers_loop = profile.name in (Framework.HF, Framework.TRL, Framework.PLAIN)
    old_default = workload.attention is AttentionImpl.AUTO and older_than(workload.versions, "sdpa_default")
    if transformers_loop and old_default:
        notes.append(rule_note(workload.versions, "sdpa_default"))
        return CudaAttention(AttentionImpl.EAGER, math_unmasked=False)
    if transformers_loop:
        resolved, note = hf_attention_kernel(workload.attention, resolved, spec)
        said = len(notes)
        cuda = on_cuda_backend(
            spec, resolved, notes, compute_bytes=compute_bytes, versions=workload.versions,
            compiled=workload.compile, per_layer=True,
        )  # fmt: skip
        if len(notes) > said:  # SDPA's math backend: its line says what was counted
            return cuda
    if note:
        notes.append(note)
    elif workload.attention is AttentionImpl.AUTO:
        notes.append(f"attention auto: {profile.attention} ({profile.name} default)")
    return CudaAttention(resolved, math_unmasked=False)


def _loss(workload: Workload, profile: FrameworkProfile, notes: list[str]) -> LossImpl:
    if workload.loss is not LossImpl.AUTO:
        return workload.loss
    fused = liger_loss(workload.kernels, profile.name)
    if fused is not None:
        notes.append(f"loss auto: {fused} (kernels liger: Liger's fused linear cross-entropy)")
        return fused
    notes.append(f"loss auto: {profile.loss} ({profile.name} default)")
    return profile.loss


def _compiled_loss(workload: Workload, profile: FrameworkProfile, notes: list[str]) -> bool:
    """An explicit ``loss: full`` means the eager cross-entropy even under compile."""
    if not (workload.compile and profile.compiles_loss and workload.loss is LossImpl.AUTO):
        return False
    if profile.loss is not LossImpl.FULL:  # a chunked or fused loss keeps its own formula
        return False
    notes.append(f"compile: {profile.name} compiles the loss with the model (fused cross-entropy)")
    return True


def _optimizer_impl(workload: Workload, profile: FrameworkProfile, notes: list[str]) -> OptimizerImpl:
    if workload.optimizer_impl is not OptimizerImpl.AUTO:
        return workload.optimizer_impl
    notes.append(f"optimizer_impl auto: {profile.optimizer_impl} ({profile.name} default)")
    return profile.optimizer_impl


def check_head_split(spec: ModelSpec, workload: Workload) -> None:
    """Tensor parallelism splits attention by heads (KV heads replicated when tp exceeds them),
    expert parallelism splits routed experts; both engines (training and inference) require it.
    A model described from its code has its layers traced whole: no TP, EP or CP split."""
    if spec.generic is not None:
        parallel = workload.parallel
        for key, value in (("parallel.tp", parallel.tp), ("parallel.ep", parallel.ep), ("parallel.cp", parallel.cp)):
            if value > 1:
                raise InputError(
                    f"{key}: {value} is not modelled for {spec.name}: with no native vramlens family its layers "
                    "are traced from transformers' code on one device (use 1, or data parallelism/sharding)"
                )
        return
    tp = workload.parallel.tp
    if spec.num_heads % tp or (spec.num_kv_heads % tp and tp % spec.num_kv_heads):
        raise InputError(
            f"parallel.tp: {tp} must divide the {spec.num_heads} attention heads and divide or be a multiple of "
            f"the {spec.num_kv_heads} KV heads of {spec.name}"
        )
    ep = workload.parallel.ep
    if ep > 1 and (spec.moe is None or spec.moe.num_experts % ep):
        experts = spec.moe.num_experts if spec.moe else 0
        raise InputError(f"parallel.ep: {ep} must divide the model's {experts} experts (ep > 1 needs an MoE model)")


def _check_model_fit(spec: ModelSpec, workload: Workload) -> None:
    """Workload rules that need the model: context length, TP/EP divisibility."""
    _check_context(spec, workload)
    check_head_split(spec, workload)
    _check_cp(workload)
    if workload.method is Method.QLORA and workload.quant is not Quant.NONE and workload.quant not in qlora_bases():
        accepted = ", ".join(quant.value for quant in qlora_bases())
        raise InputError(f"quant: qlora trains adapters on a 4-bit base; got {workload.quant} (use {accepted})")


def _check_context(spec: ModelSpec, workload: Workload) -> None:
    limit = spec.max_position_embeddings
    if workload.seq > limit and not workload.allow_long_context:
        raise InputError(
            f"seq: {workload.seq} exceeds {spec.name}'s max_position_embeddings {limit}; "
            "set allow_long_context: true if the model is set up for it (RoPE scaling)"
        )


def _check_cp(workload: Workload) -> None:
    if workload.seq % workload.parallel.cp:
        raise InputError(f"parallel.cp: {workload.parallel.cp} must divide seq {workload.seq}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SettingsInputs:
    """The workload keys a context's settings depend on: their memo key."""

    framework: Framework
    precision: Precision
    sharded: bool
    method: Method
    quant: Quant
    optimizer_in_backward: bool
    compile: bool
    attention: AttentionImpl
    loss: LossImpl
    optimizer_impl: OptimizerImpl
    float8: bool
    packing: bool
    kernels: Kernels
    versions: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, workload: Workload) -> SettingsInputs:
        return cls(
            framework=workload.framework, precision=workload.precision,
            sharded=workload.parallel.shard in (Shard.FSDP, Shard.HSDP, Shard.ZERO3), method=workload.method,
            quant=workload.quant, optimizer_in_backward=workload.optimizer_in_backward, compile=workload.compile,
            attention=workload.attention, loss=workload.loss, optimizer_impl=workload.optimizer_impl,
            float8=workload.float8, packing=workload.packing, kernels=workload.kernels, versions=workload.versions,
        )  # fmt: skip


def _resolved_settings(spec: ModelSpec, workload: Workload) -> dict[str, object]:
    """The workload-dependent settings of a context, memoized on the spec by the keys they read."""
    key = SettingsInputs.of(workload)
    return memo(spec, key, lambda: _settings(workload, spec))


def _settings(workload: Workload, spec: ModelSpec) -> dict[str, object]:
    profile, note = profile_for(workload.framework)
    check_kernels(spec.model_type, workload.kernels, profile.name)
    sharded = workload.parallel.shard in (Shard.FSDP, Shard.HSDP, Shard.ZERO3)
    notes = [note] if note else []
    if profile.name is Framework.PLAIN:
        notes.append(PLAIN_NOTE)
    sizes = _dtypes(workload.precision, profile, sharded_params=sharded)
    sizes["compute"] = prepared_compute_bytes(
        workload, profile, compute=int(sizes["compute"]), autocast=bool(sizes["autocast"])
    )
    if workload.precision.mixed:
        notes.append(f"precision {workload.precision}: {profile.mixed} ({profile.name})")
    if workload.optimizer_in_backward and workload.compile and not profile.compiles_per_layer:
        notes.append(
            "optimizer_in_backward under compile: the compiled backward returns all gradients at once, so they are not freed early"
        )
    elif workload.optimizer_in_backward and workload.compile:
        notes.append(
            f"optimizer_in_backward under compile: {profile.name} compiles each layer on its own, so gradients are "
            "still stepped and freed layer by layer"
        )
    if workload.float8:
        notes.append(
            "float8: torchao Float8Linear keeps the high-precision inputs for backward and casts to fp8 per matmul, "
            "so activations and weights are counted as in bf16"
        )
    if workload.packing:
        notes.append("packing: every sample fills seq; document boundaries handled by a varlen kernel without a mask")
    if workload.method is Method.QLORA and workload.quant is Quant.NONE:
        notes.append("method qlora without quant: assuming nf4-dq (QLoRA: NF4 with double quantization)")
    notes.extend(kbit_notes(workload, profile))
    attention = _attention(workload, profile, spec, notes, compute_bytes=int(sizes["compute"]))
    settings: dict[str, object] = {
        "profile": profile,
        "param_bytes": int(sizes["param"]),
        "frozen_bytes": float(sizes["param"] if workload.method is Method.FULL else sizes["compute"]),
        "compute_bytes": int(sizes["compute"]),
        "grad_bytes": int(sizes["grad"]),
        "state_bytes": int(sizes["state"]),
        "master_bytes": int(sizes["master"]),
        "autocast": bool(sizes["autocast"]),
        "attention": attention.kernel,
        "math_unmasked": attention.math_unmasked,
        "loss": _loss(workload, profile, notes),
        "optimizer_impl": _optimizer_impl(workload, profile, notes),
        "compiled_loss": _compiled_loss(workload, profile, notes),
    }
    settings["assumptions"] = tuple(notes)
    return settings


def resize_training(ctx: TrainingContext, workload: Workload) -> TrainingContext:
    """``ctx`` resolved for ``workload``, whose keys are ``ctx.workload``'s but for the batch and the
    sequence length (and how the model and GPU are named): the same settings; of
    :func:`resolve_training`'s checks, those that read the sequence length (the others passed for
    ``ctx``, so the first that fails is the one :func:`resolve_training` would report)."""
    _check_context(ctx.spec, workload)
    _check_cp(workload)
    return _resized(ctx, workload, workload.batch * workload.seq // workload.parallel.cp)


#: A context's copy with another workload and tokens, its other fields set as ``__init__`` would.
_resized = replacer(TrainingContext, "workload", "tokens")


def resolve_training(spec: ModelSpec, workload: Workload) -> TrainingContext:
    """Resolve ``workload`` for ``spec``; raises :class:`InputError` naming the key on conflicts."""
    _check_model_fit(spec, workload)
    parallel = workload.parallel
    return TrainingContext(
        spec=spec,
        workload=workload,
        tokens=workload.batch * workload.seq // parallel.cp,
        shard_group=parallel.shard_group,
        zero=zero_settings(spec.hidden_size, parallel),
        **_resolved_settings(spec, workload),  # type: ignore[arg-type]
    )
