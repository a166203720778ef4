"""CPU stand-ins for Liger-Kernel's autograd functions, keeping for backward exactly what Liger's keep.

Liger's kernels are Triton and do not run on CPU. Each stand-in computes its output with torch
ops inside ``autograd.Function.forward`` (nothing recorded) and saves the tensors the Liger
function saves (Liger-Kernel main, 2026-08, ``src/liger_kernel/ops/``):

* ``LigerRMSNormFunction.forward``: ``ctx.save_for_backward(X, W, RSTD)``, ``Y`` in ``X``'s dtype,
  ``RSTD`` fp32 per row (``casting_mode`` llama and gemma);
* ``LigerSiLUMulFunction`` / ``LigerGELUMulFunction``: ``ctx.save_for_backward(a, b)`` after
  ``ensure_contiguous``, returning a new product ``c``;
* ``LigerRopeFunction``: rotates ``q`` and ``k`` in place (``rope_forward``) and saves ``(cos, sin)``.

:func:`liger_applied` patches a transformers model as ``_apply_liger_kernel_to_instance`` does
(``liger_kernel/transformers/monkey_patch.py``): the decoder layers' two norms and the final norm,
each layer's MLP forward (``LigerSwiGLUMLP``, ``LigerPhi3SwiGLUMLP``, ``LigerGEGLUMLP``), and the
modeling module's ``apply_rotary_pos_emb``. Used by tests only.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import MethodType
from typing import Any

import torch


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any, weight: Any, eps: float, offset: float) -> Any:
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
        y = (x.float() * rstd.unsqueeze(-1) * (offset + weight.float())).to(x.dtype)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx: Any, dy: Any) -> Any:  # pragma: no cover - only the forward's saved tensors are read
        raise NotImplementedError


class _ActMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: Any, b: Any, gelu: bool) -> Any:
        a, b = a.contiguous(), b.contiguous()
        act = torch.nn.functional.gelu(a, approximate="tanh") if gelu else torch.nn.functional.silu(a)
        ctx.save_for_backward(a, b)
        return act * b

    @staticmethod
    def backward(ctx: Any, dc: Any) -> Any:  # pragma: no cover
        raise NotImplementedError


def _rotate_half(x: Any) -> Any:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, cos: Any, sin: Any) -> Any:
        cos4, sin4 = cos.unsqueeze(1), sin.unsqueeze(1)
        for x in (q, k):  # in place, as rope_forward's kernel writes q and k
            x.copy_(x * cos4 + _rotate_half(x) * sin4)
        ctx.save_for_backward(cos, sin)
        return q, k

    @staticmethod
    def backward(ctx: Any, dq: Any, dk: Any) -> Any:  # pragma: no cover
        raise NotImplementedError


def _rope(q: Any, k: Any, cos: Any, sin: Any, position_ids: Any = None, unsqueeze_dim: int = 1) -> Any:
    return _Rope.apply(q, k, cos, sin)


def _norm_forward(offset: float) -> Any:
    def forward(self: Any, hidden_states: Any) -> Any:
        eps = getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6))
        return _RMSNorm.apply(hidden_states, self.weight, eps, offset)

    return forward


def _mlp_forward(kind: str) -> Any:
    def forward(self: Any, x: Any) -> Any:
        if kind == "phi3":
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(_ActMul.apply(gate, up, kind == "geglu"))

    return forward


@contextlib.contextmanager
def liger_applied(model: Any) -> Iterator[None]:
    """Patch ``model`` (a transformers causal LM) as Liger's instance patch does (norms, MLP, and the
    modeling module's RoPE, restored on exit: other tests build the same family)."""
    model_type = model.config.model_type
    modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    original = modeling.apply_rotary_pos_emb
    modeling.apply_rotary_pos_emb = _rope
    try:
        _patch_modules(model, model_type)
        yield
    finally:
        modeling.apply_rotary_pos_emb = original


def _patch_modules(model: Any, model_type: str) -> None:
    offset = 1.0 if model_type == "gemma" else 0.0
    mlp = {"phi3": "phi3", "gemma": "geglu"}.get(model_type, "swiglu")
    base = getattr(model, model.base_model_prefix, model)
    base.norm.forward = MethodType(_norm_forward(offset), base.norm)
    for layer in base.layers:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.forward = MethodType(_norm_forward(offset), norm)
        layer.mlp.forward = MethodType(_mlp_forward(mlp), layer.mlp)
