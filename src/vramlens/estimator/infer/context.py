"""``InferenceContext``: an inference workload resolved against its model, engine and GPU.

Checks the keys that need the model (context length, tensor-parallel heads,
KV dtype per engine, batch against ``max_num_seqs``) with one-line errors that
name the key, and records every default it picks in ``assumptions``.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.errors import InputError
from vramlens.estimator.infer.engines import vllm_batched_tokens
from vramlens.estimator.weight_format import WeightFormat, format_for_checkpoint, format_for_quant
from vramlens.hardware import GpuSpec
from vramlens.model.spec import ModelSpec
from vramlens.resolve.attention import hf_attention_kernel, on_cuda_backend
from vramlens.resolve.context import check_head_split
from vramlens.workload.options import AttentionImpl, Engine, Framework, KvDtype, Precision, Quant
from vramlens.workload.spec import Workload
from vramlens.workload.versions import older_than, rule_note

__all__ = ["InferenceContext", "inference_engine", "resolve_inference"]

_COMPUTE_BYTES = {Precision.FP32: 4}


@dataclass(frozen=True, kw_only=True, slots=True)
class InferenceContext:
    """Resolved settings of one inference workload on one rank."""

    spec: ModelSpec
    workload: Workload
    engine: Engine
    weights: WeightFormat | None
    """Storage of the quantized linears; None when weights are in the compute dtype."""
    compute_bytes: int
    """Bytes per element of activations and unquantized weights."""
    kv_bytes: int
    """Bytes per cached key/value element."""
    attention: AttentionImpl
    prompt: int
    """Prompt tokens per sequence (prefilled at once, or in chunks of ``step_tokens``)."""
    context: int
    """Tokens per sequence at the end of generation (prompt + generated)."""
    step_tokens: int
    """Tokens of one prefill forward over the whole batch (vLLM: its batched-token budget)."""
    latent_kv: bool
    """MLA caches the compressed latent (vLLM) rather than full keys and values (transformers)."""
    assumptions: tuple[str, ...]

    @property
    def batch(self) -> int:
        return self.workload.batch

    @property
    def tp(self) -> int:
        return self.workload.parallel.tp


def inference_engine(workload: Workload) -> Engine:
    """The engine an inference workload runs on: ``framework: vllm`` means vLLM, otherwise ``engine``.
    Training frameworks, and ``framework: hf`` with ``engine: vllm``, are errors naming the key."""
    framework = workload.framework
    if framework is Framework.VLLM:
        return Engine.VLLM
    if framework not in (Framework.AUTO, Framework.HF):
        raise InputError(
            f"framework: {framework} is a training framework; for mode infer use framework hf or vllm (or engine)"
        )
    if framework is Framework.HF and workload.engine is Engine.VLLM:
        raise InputError("engine: vllm conflicts with framework hf (transformers); use framework vllm or auto")
    return workload.engine


def _weights(spec: ModelSpec, workload: Workload, notes: list[str]) -> WeightFormat | None:
    checkpoint = format_for_checkpoint(spec.quantization) if spec.quantization is not None else None
    if workload.quant is Quant.NONE:
        if checkpoint is not None:
            notes.append(f"quant: {checkpoint.name} from the checkpoint's quantization_config")
        return checkpoint
    if checkpoint is not None and checkpoint.name != workload.quant.value:
        notes.append(
            f"quant: {workload.quant} given; the checkpoint declares {checkpoint.name} (using {workload.quant})"
        )
    return format_for_quant(workload.quant)


def _kv_bytes(workload: Workload, engine: Engine, compute_bytes: int, notes: list[str]) -> int:
    kv = workload.kv_dtype
    if kv is KvDtype.FP8 and engine is Engine.HF:
        raise InputError("kv_dtype: fp8 needs engine vllm; transformers' caches keep the compute dtype (use auto)")
    if kv is KvDtype.AUTO:
        notes.append(f"kv_dtype auto: the compute dtype ({compute_bytes} bytes per element)")
        return compute_bytes
    return 1 if kv is KvDtype.FP8 else 2


def _check(spec: ModelSpec, workload: Workload, engine: Engine) -> None:
    limit = spec.max_position_embeddings
    total = workload.total_context
    if total > limit and not workload.allow_long_context:
        key = "context" if workload.context is not None else "prompt + generate"
        raise InputError(
            f"{key}: {total} tokens exceed {spec.name}'s max_position_embeddings {limit}; "
            "set allow_long_context: true if the model is set up for it (RoPE scaling)"
        )
    check_head_split(spec, workload)
    if workload.parallel.pp > spec.num_layers:
        raise InputError(
            f"parallel.pp: {workload.parallel.pp} stages for {spec.num_layers} layers; at most one per layer"
        )
    if engine is Engine.VLLM and workload.batch > workload.max_num_seqs:
        raise InputError(
            f"batch: {workload.batch} concurrent sequences exceed max_num_seqs {workload.max_num_seqs} "
            "(vLLM runs at most max_num_seqs at once)"
        )


def _attention(spec: ModelSpec, workload: Workload, engine: Engine, notes: list[str], compute: int) -> AttentionImpl:
    if engine is Engine.VLLM:
        if workload.attention not in (AttentionImpl.AUTO, AttentionImpl.FLASH):
            notes.append(f"attention {workload.attention}: vLLM uses its own flash/paged kernels (no score matrix)")
        return AttentionImpl.FLASH
    resolved = workload.attention
    if resolved is AttentionImpl.AUTO:
        if older_than(workload.versions, "sdpa_default"):
            notes.append(rule_note(workload.versions, "sdpa_default"))
            return AttentionImpl.EAGER
        resolved = AttentionImpl.SDPA
    kernel, note = hf_attention_kernel(workload.attention, resolved, spec)
    said = len(notes)
    kernel = on_cuda_backend(spec, kernel, notes, compute_bytes=compute, versions=workload.versions).kernel
    if note:
        notes.append(note)
    elif workload.attention is AttentionImpl.AUTO and len(notes) == said:
        notes.append("attention auto: sdpa (transformers default; fused kernels, no score matrix)")
    return kernel


def resolve_inference(spec: ModelSpec, workload: Workload, gpu: GpuSpec | None) -> InferenceContext:
    """Resolve ``workload`` for ``spec``; raises :class:`InputError` naming the key on conflicts."""
    notes: list[str] = []
    engine = inference_engine(workload)
    if engine is Engine.HF:
        notes.append("engine hf: transformers generate() with its default DynamicCache, batch sequences padded alike")
    _check(spec, workload, engine)
    compute = _COMPUTE_BYTES.get(workload.precision, 2)
    if workload.precision.mixed:
        notes.append(f"precision {workload.precision}: inference keeps weights and activations in the compute dtype")
    prompt = workload.context if workload.context is not None else workload.prompt
    if workload.context is not None:
        notes.append(f"context {workload.context}: the whole context is prefilled (the largest prefill)")
    chunk = workload.max_num_batched_tokens
    if engine is Engine.VLLM:
        if chunk is None:
            chunk = vllm_batched_tokens(gpu.name if gpu else None, gpu.memory_bytes if gpu else None)
            notes.append(f"max_num_batched_tokens: {chunk} (vllm serve default for this GPU); prefill is chunked")
        step = chunk
    else:
        step = workload.batch * (min(prompt, chunk) if chunk is not None else prompt)
    return InferenceContext(
        spec=spec,
        workload=workload,
        engine=engine,
        weights=_weights(spec, workload, notes),
        compute_bytes=compute,
        kv_bytes=_kv_bytes(workload, engine, compute, notes),
        attention=_attention(spec, workload, engine, notes, compute),
        prompt=prompt,
        context=workload.total_context,
        step_tokens=step,
        latent_kv=engine is Engine.VLLM,
        assumptions=tuple(notes),
    )
