"""Activation functions of transformers' ``ACT2FN``: what each keeps for backward and holds
while it runs.

Units: tensors of the activation's input size (``tokens x intermediate`` elements in the
compute dtype). One kernel (``F.silu``, ``F.gelu``, ``nn.ReLU``) keeps one tensor and has
its input and output alive; activations written as Python arithmetic (``NewGELUActivation``
for ``gelu_new``, ``FastGELUActivation``, ...) keep the intermediates that their
multiplications and ``tanh``/``erf`` need and have several temporaries alive at once.

Source: ``transformers/activations.py`` (5.x, ``ACT2CLS``); each row was counted on CPU
with ``torch.autograd.graph.saved_tensors_hooks`` (saved storages) and a tracked no-grad
forward (live peak), and ``tests/estimator/test_act_fns_hf.py`` re-counts them against the
installed transformers. Autograd keeps the same tensors on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["ACTIVATION_FNS", "ActivationFn", "activation_fn"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ActivationFn:
    """Memory facts of one activation function, in tensors of its input's size."""

    saved_inner: int
    """Tensors autograd keeps for its backward other than its output: the input (silu, gelu)
    and the intermediates of a composed formula (``0.5 * x``, ``tanh(...)``, ``1 + tanh``)."""
    saves_output: bool = False
    """Autograd keeps its output (relu, tanh, sigmoid differentiate through their result).
    In an MLP that tensor is also the next matmul's kept input, so it is counted once."""
    forward_peak: int = 2
    """Tensors alive at once in a no-grad forward, the input and the output included."""
    source: str


_KERNEL = "one ATen kernel: keeps its input; input and output alive"
_RESULT = "one ATen kernel differentiated through its result: keeps its output"

ACTIVATION_FNS: Final[dict[str, ActivationFn]] = {
    "silu": ActivationFn(saved_inner=1, source=f"SiLUActivation (F.silu), {_KERNEL}"),
    "swish": ActivationFn(saved_inner=1, source=f"nn.SiLU, {_KERNEL}"),
    "gelu": ActivationFn(saved_inner=1, source=f"GELUActivation (F.gelu), {_KERNEL}"),
    "gelu_pytorch_tanh": ActivationFn(saved_inner=1, source=f"GELUTanh (F.gelu approximate='tanh'), {_KERNEL}"),
    "relu6": ActivationFn(saved_inner=1, source=f"nn.ReLU6 (hardtanh), {_KERNEL}"),
    "leaky_relu": ActivationFn(saved_inner=1, source=f"nn.LeakyReLU, {_KERNEL}"),
    "mish": ActivationFn(saved_inner=1, source=f"MishActivation (F.mish), {_KERNEL}"),
    "relu": ActivationFn(saved_inner=0, saves_output=True, source=f"nn.ReLU, {_RESULT}"),
    "tanh": ActivationFn(saved_inner=0, saves_output=True, source=f"nn.Tanh, {_RESULT}"),
    "sigmoid": ActivationFn(saved_inner=0, saves_output=True, source=f"nn.Sigmoid, {_RESULT}"),
    "gelu_new": ActivationFn(
        saved_inner=4,
        forward_peak=4,
        source="NewGELUActivation: 0.5*x*(1+tanh(c*(x+0.044715*x^3))); keeps x (pow), tanh output, "
        "1+tanh and 0.5*x (the final product); x, 0.5*x and two temporaries alive at once",
    ),
    "gelu_python_tanh": ActivationFn(
        saved_inner=4, forward_peak=4, source="GELUTanh(use_gelu_tanh_python=True): the gelu_new formula"
    ),
    "gelu_accurate": ActivationFn(
        saved_inner=4, forward_peak=4, source="AccurateGELUActivation: the gelu_new formula with a precomputed constant"
    ),
    "gelu_fast": ActivationFn(
        saved_inner=7,
        forward_peak=5,
        source="FastGELUActivation: 0.5*x*(1+tanh(x*0.79788*(1+0.044715*x*x))); every product of two "
        "tensors keeps both factors (x, x*x, x*c, 1+..., tanh output, 1+tanh, 0.5*x)",
    ),
    "gelu_python": ActivationFn(
        saved_inner=3, forward_peak=4, source="GELUActivation(use_gelu_python=True): x*0.5*(1+erf(x/sqrt(2)))"
    ),
    "quick_gelu": ActivationFn(
        saved_inner=2, forward_peak=3, source="QuickGELUActivation: x*sigmoid(1.702*x); keeps x and the sigmoid"
    ),
    "gelu_10": ActivationFn(saved_inner=2, forward_peak=3, source="ClippedGELUActivation: clip(gelu(x), -10, 10)"),
    "relu2": ActivationFn(saved_inner=1, forward_peak=3, source="ReLUSquaredActivation: square(relu(x))"),
    "linear": ActivationFn(saved_inner=0, forward_peak=1, source="LinearActivation: returns its input"),
}

_DEFAULT = ACTIVATION_FNS["silu"]


def activation_fn(name: str) -> ActivationFn:
    """The row of ``name`` (one-kernel behaviour, like silu, for names not in the table)."""
    return ACTIVATION_FNS.get(name, _DEFAULT)
