"""The attention kernel transformers runs for a workload's ``attention`` value.

transformers 5.x (``PreTrainedModel.get_correct_attn_implementation`` and
``_sdpa_can_dispatch`` in ``modeling_utils.py``) resolves ``attn_implementation=None`` -
what ``from_pretrained`` gets when the user passes nothing, and so what HF Trainer and
TRL users get - to ``"sdpa"``, and falls back to ``"eager"`` when the model class sets
``_supports_sdpa = False``; an explicit ``"sdpa"`` on such a class raises ``ValueError``.
``"flash_attention_2"`` is used only when asked for, whether or not ``flash-attn`` is
installed. Gemma 2 is such a class (``_supports_sdpa = False``: SDPA cannot soft-cap the
attention logits; ``_supports_flash_attn = True``: flash-attention 2 soft-caps in the kernel).

So for a family without SDPA (``HfStyle.sdpa``): ``auto`` and ``eager`` are eager attention
(the s x s probabilities kept), ``flash`` is flash-attention 2 (O(s), no mask: it applies
sliding windows and GQA itself), ``sdpa`` and ``efficient`` (SDPA's memory-efficient
backend) are errors, as in transformers. gpt-oss is another such class (``_supports_sdpa =
False``: SDPA has no attention sinks): requesting ``flash_attention_2`` makes transformers load
``kernels-community/vllm-flash-attn3`` instead (its ``_compatible_flash_implementations``), a
flash-attention 3 kernel that takes the sinks; ``HfStyle.gpu_kernel`` names the kernel per family.
A family without flash-attention 2 (``HfStyle.flash``:
Llama 4, whose chunked attention flash cannot mask) refuses ``flash`` the same way.

Which SDPA backend then runs depends on the tensors (``select_sdp_backend`` in torch's
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``): flash and cuDNN take fp16/bf16 only, and
the memory-efficient kernel has no grouped-query support (its dense constraints instantiate
``check_batch_size_and_num_heads_dense<false>``). transformers hands SDPA the grouped keys and
values with ``enable_gqa=True`` whenever there is no mask and the head dimension is at most 256
(``use_gqa_in_sdpa``, torch >= 2.5).
So fp32 queries (``precision: fp32``, or a QLoRA base after ``prepare_model_for_kbit_training``
without autocast) on a model with fewer KV heads than query heads run the **math** backend, which
repeats the keys and values to every head and keeps the ``heads x s x s`` probabilities for
backward, as eager attention does (:func:`sdpa_runs_math`); on a model with sliding or chunked
layers only the layers no mask reaches do (:attr:`CudaAttention.math_unmasked`). Measured: QLoRA on Llama-3.2-1B and
Qwen2.5-3B without autocast on an H200 (``validation/measured/2026-11-27-h200``) allocated 1.8x and
1.5x what a fused kernel would.
"""

from __future__ import annotations

from typing import NamedTuple

from vramlens.errors import InputError
from vramlens.model.spec import ModelSpec
from vramlens.resolve.styles import HfStyle, hf_style
from vramlens.workload.options import AttentionImpl
from vramlens.workload.versions import older_than

__all__ = [
    "MATH_GLOBAL_NOTE",
    "MATH_NOTE",
    "MATH_UNCOUNTED_NOTE",
    "CudaAttention",
    "hf_attention_kernel",
    "on_cuda_backend",
    "sdpa_runs_math",
    "supports_sdpa",
]

#: The report's line where only a model's global layers run the math backend (its sliding or chunked
#: layers get a mask, so repeated keys and a fused kernel): those layers count as eager attention.
MATH_GLOBAL_NOTE = (
    "attention sdpa: fp32 queries with grouped KV heads: on CUDA the layers no mask reaches run SDPA's math "
    "backend and keep heads x s x s probabilities (counted as eager attention there); the sliding or chunked "
    "layers run a fused kernel"
)
#: The report's line where the math backend runs but is not counted: under torch.compile (what
#: Inductor keeps of the decomposed math is not read yet), and in generate() on a model with
#: sliding or chunked layers (the inference engine has one kernel for every layer).
MATH_UNCOUNTED_NOTE = (
    "attention sdpa: fp32 queries with grouped KV heads run SDPA's math backend on CUDA in the layers no mask "
    "reaches; not modelled under compile, or in generate with sliding or chunked layers: counted as a fused "
    "kernel, low; use autocast or bf16"
)
#: Largest head dimension for which transformers hands SDPA grouped keys and values
#: (``use_gqa_in_sdpa`` in ``transformers/integrations/sdpa_attention.py``, 5.x).
_GQA_HEAD_DIM = 256
#: The report's line when SDPA runs its math backend (:func:`sdpa_runs_math`).
MATH_NOTE = (
    "attention sdpa: fp32 queries with grouped KV heads reach no fused SDPA kernel on CUDA (flash and cuDNN "
    "take fp16/bf16, memory-efficient has no enable_gqa), so torch runs its math backend, which keeps the "
    "heads x s x s probabilities as eager attention does: counted as eager"
)


def supports_sdpa(spec: ModelSpec) -> bool:
    """Whether transformers' class of the model accepts SDPA: the native family's style, or for a
    model described from its code, the class's own ``_supports_sdpa`` as the reader found it."""
    return spec.generic.sdpa if spec.generic is not None else hf_style(spec.model_type).sdpa


def hf_attention_kernel(
    requested: AttentionImpl, resolved: AttentionImpl, spec: ModelSpec
) -> tuple[AttentionImpl, str]:
    """The kernel of a transformers run and a note saying why, or ``(resolved, "")`` when the
    family supports SDPA. ``requested`` is the workload's value, ``resolved`` the value after
    the framework default replaced ``auto``. Raises :class:`InputError` for ``sdpa`` and
    ``efficient`` on a family whose transformers class refuses SDPA."""
    model_type = spec.model_type
    if spec.generic is None and resolved is AttentionImpl.FLASH and not hf_style(model_type).flash:
        raise InputError(
            f"attention: {requested} - transformers has no flash-attention 2 for {model_type} (its class sets "
            "_supports_flash_attn = False); accepted: auto or sdpa (SDPA), eager"
        )
    if supports_sdpa(spec) or resolved is AttentionImpl.EAGER:
        return resolved, ""
    style = hf_style(model_type) if spec.generic is None else HfStyle()
    if requested is AttentionImpl.AUTO:
        return AttentionImpl.EAGER, (
            f"attention auto: transformers' {model_type} class has no SDPA support, so its default (attn_implementation "
            f"unset) is eager attention with s x s scores; `attention: flash` runs {style.gpu_kernel}"
        )
    if resolved is AttentionImpl.FLASH:
        return AttentionImpl.FLASH, f"attention flash: {style.gpu_kernel} for {model_type}"
    raise InputError(
        f"attention: {requested} - transformers refuses SDPA for {model_type} (its class sets _supports_sdpa = False); "
        f"accepted: auto or eager (eager attention), flash ({style.gpu_kernel})"
    )


def sdpa_runs_math(
    spec: ModelSpec, kernel: AttentionImpl, *, compute_bytes: int, versions: tuple[tuple[str, str], ...]
) -> bool:
    """Whether transformers' SDPA call runs torch's math backend (see the module doc): ``kernel``
    (the resolved one) is SDPA or memory-efficient; the queries are fp32 (``compute_bytes`` 4: no
    autocast); the model groups its KV heads with a head dimension of at most 256 (above it
    ``use_gqa_in_sdpa`` repeats keys and values, which the memory-efficient kernel takes); the
    family hands SDPA no mask (a sliding or chunked layer gets one: the caller says so,
    :data:`MATH_GLOBAL_NOTE`); torch has ``enable_gqa`` (2.5). A model read from its code
    (generic) is traced as it runs: not decided here."""
    if kernel not in (AttentionImpl.SDPA, AttentionImpl.EFFICIENT) or compute_bytes != 4 or spec.generic is not None:
        return False
    if spec.attn.mla is not None or not 0 < spec.num_kv_heads < spec.num_heads or spec.head_dim > _GQA_HEAD_DIM:
        return False
    style = hf_style(spec.model_type)
    return not (style.sdpa_mask or style.kv_repeat or older_than(versions, "sdpa_enable_gqa"))


class CudaAttention(NamedTuple):
    """The attention kernel CUDA runs (:func:`on_cuda_backend`)."""

    kernel: AttentionImpl
    math_unmasked: bool
    """The layers no mask reaches run SDPA's math backend, the sliding or chunked ones ``kernel``:
    those layers keep what eager attention keeps."""


def on_cuda_backend(
    spec: ModelSpec,
    kernel: AttentionImpl,
    notes: list[str],
    *,
    compute_bytes: int,
    versions: tuple[tuple[str, str], ...],
    compiled: bool = False,
    per_layer: bool = False,
) -> CudaAttention:
    """``kernel`` as CUDA runs it, with the report's line where SDPA runs its math backend
    (:func:`sdpa_runs_math`): eager for a model whose every attention layer runs it
    (:data:`MATH_NOTE`); ``math_unmasked`` where only the layers no mask reaches do and the engine
    counts kernels layer by layer (``per_layer``: training; :data:`MATH_GLOBAL_NOTE`); unchanged,
    said but not counted, under compile or where the engine cannot (:data:`MATH_UNCOUNTED_NOTE`)."""
    if not sdpa_runs_math(spec, kernel, compute_bytes=compute_bytes, versions=versions):
        return CudaAttention(kernel, math_unmasked=False)
    if not compiled and not _masked_layers(spec):
        notes.append(MATH_NOTE)
        return CudaAttention(AttentionImpl.EAGER, math_unmasked=False)
    if not compiled and per_layer:
        notes.append(MATH_GLOBAL_NOTE)
        return CudaAttention(kernel, math_unmasked=True)
    notes.append(MATH_UNCOUNTED_NOTE)
    return CudaAttention(kernel, math_unmasked=False)


def _masked_layers(spec: ModelSpec) -> bool:
    """The model has sliding-window or chunked attention layers (masked once the sequence is longer)."""
    return any(layer.window or layer.chunk for layer in spec.layers)
