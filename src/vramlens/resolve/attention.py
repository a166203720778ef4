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
"""

from __future__ import annotations

from vramlens.errors import InputError
from vramlens.model.spec import ModelSpec
from vramlens.resolve.styles import HfStyle, hf_style
from vramlens.workload.options import AttentionImpl

__all__ = ["hf_attention_kernel", "supports_sdpa"]


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
