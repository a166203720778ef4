"""What ``kernels: liger`` replaces in a transformers model, family by family.

HF Trainer's ``use_liger_kernel=True`` (TRL's configs inherit it) calls Liger-Kernel's
``_apply_liger_kernel_to_instance`` on the model (PEFT: on its base model), which runs the
family's ``apply_liger_kernel_to_<model_type>`` with its defaults: ``rope``, ``rms_norm``,
``swiglu`` (``geglu`` for Gemma) and ``fused_linear_cross_entropy`` on, ``cross_entropy`` off.
What each replacement keeps for backward, read from Liger-Kernel's ``ops/`` (main, 2026-08):

* ``LigerRMSNormFunction.forward`` saves ``(X, W, RSTD)``: the input and one fp32 statistic per
  row, as a fused norm (:attr:`vramlens.estimator.saved_parts.LayerRecipe.fused_norm`); it
  patches the decoder layers' two norms and the final norm, not Qwen 3's ``q_norm``/``k_norm``;
* ``LigerSiLUMulFunction`` / ``LigerGELUMulFunction`` save the gate and up outputs ``(a, b)``
  and return the product (the down projection's input); the activation is recomputed in
  backward, which writes both gradients into ``a`` and ``b`` in place
  (:attr:`~vramlens.estimator.saved_parts.LayerRecipe.fused_pointwise`). Phi-3's
  ``LigerPhi3SwiGLUMLP`` chunks the fused ``gate_up_proj`` output and ``ensure_contiguous``
  copies both halves, which it saves: the same two tensors;
* ``LigerRopeFunction`` rotates queries and keys in place and saves only the (cos, sin) tables;
* the model's ``forward`` becomes ``lce_forward``: the loss is ``LigerFusedLinearCrossEntropy``
  over chunks and no logits are returned (``loss: fused-linear``). TRL's trainers put their own
  fused LM head in front (``use_liger_kernel`` no longer fuses their loss): ``loss: auto`` stays
  theirs.

Families whose patch does more than this (MoE experts, Gemma 2/3's extra norms, multimodal
wrappers) are not listed, and ``kernels: liger`` is refused for them rather than estimated as
a look-alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from vramlens.errors import InputError
from vramlens.workload.options import Framework, Kernels, LossImpl

__all__ = ["LIGER_FRAMEWORKS", "LIGER_PATCHES", "LigerPatch", "check_kernels", "liger_layers", "liger_loss"]


@dataclass(frozen=True, kw_only=True, slots=True)
class LigerPatch:
    """What ``apply_liger_kernel_to_<model_type>`` replaces with its defaults."""

    mlp: str
    """The MLP's fused activation-product function: ``swiglu`` or ``geglu``."""
    source: str


_SWIGLU = "swiglu"
_GEGLU = "geglu"
_MONKEY_PATCH = "liger_kernel/transformers/monkey_patch.py"

#: Families whose Liger patch is exactly: decoder and final RMSNorms, the gated MLP, RoPE, fused
#: linear cross-entropy (each entry's function, read in Liger-Kernel main of 2026-08).
LIGER_PATCHES: Final[dict[str, LigerPatch]] = {
    "llama": LigerPatch(mlp=_SWIGLU, source=f"{_MONKEY_PATCH} apply_liger_kernel_to_llama"),
    "mistral": LigerPatch(mlp=_SWIGLU, source=f"{_MONKEY_PATCH} apply_liger_kernel_to_mistral"),
    "qwen2": LigerPatch(mlp=_SWIGLU, source=f"{_MONKEY_PATCH} apply_liger_kernel_to_qwen2"),
    "qwen3": LigerPatch(mlp=_SWIGLU, source=f"{_MONKEY_PATCH} apply_liger_kernel_to_qwen3 (q_norm, k_norm left eager)"),
    "smollm3": LigerPatch(mlp=_SWIGLU, source=f"{_MONKEY_PATCH} apply_liger_kernel_to_smollm3"),
    "phi3": LigerPatch(mlp=_SWIGLU, source=f"{_MONKEY_PATCH} apply_liger_kernel_to_phi3 (LigerPhi3SwiGLUMLP)"),
    "gemma": LigerPatch(mlp=_GEGLU, source=f"{_MONKEY_PATCH} apply_liger_kernel_to_gemma (LigerRMSNormForGemma)"),
}

#: Frameworks that run transformers' modules, which Liger patches: Trainer's and TRL's
#: ``use_liger_kernel``, a plain loop calling ``apply_liger_kernel_to_*``, DeepSpeed under Trainer.
#: torchtitan, torchtune, litgpt and Megatron build their own modules.
LIGER_FRAMEWORKS: Final[frozenset[Framework]] = frozenset(
    {Framework.HF, Framework.TRL, Framework.PLAIN, Framework.DEEPSPEED}
)

#: Frameworks whose ``loss: auto`` becomes Liger's fused linear cross-entropy (TRL keeps its own).
_FUSES_LOSS: Final[frozenset[Framework]] = frozenset({Framework.HF, Framework.PLAIN, Framework.DEEPSPEED})


def check_kernels(model_type: str, kernels: Kernels, framework: Framework) -> None:
    """Refuse, in one line naming ``kernels``, a Liger run vramlens does not describe exactly."""
    if kernels is Kernels.EAGER:
        return
    if framework not in LIGER_FRAMEWORKS:
        accepted = ", ".join(sorted(f.value for f in LIGER_FRAMEWORKS))
        raise InputError(
            f"kernels: liger patches transformers' modules; framework {framework.value} builds its own "
            f"(accepted with: {accepted})"
        )
    if model_type not in LIGER_PATCHES:
        accepted = ", ".join(sorted(LIGER_PATCHES))
        raise InputError(
            f"kernels: liger is described for model types {accepted}; {model_type or 'this model'} is not "
            "(Liger has no patch for it, or one vramlens does not describe)"
        )


def liger_layers(kernels: Kernels) -> bool:
    """The layers' norms and gated MLP keep what Liger's autograd functions keep."""
    return kernels is Kernels.LIGER


def liger_loss(kernels: Kernels, framework: Framework) -> LossImpl | None:
    """What ``loss: auto`` means under ``kernels``, or None where the framework's own default holds."""
    if kernels is Kernels.LIGER and framework in _FUSES_LOSS:
        return LossImpl.FUSED_LINEAR
    return None
