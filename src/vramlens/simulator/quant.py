"""QLoRA on fake tensors: bitsandbytes NF4 linears, PEFT's 4-bit LoRA forward, k-bit preparation.

Mirrors, in memory, what ``from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit))``,
``peft.prepare_model_for_kbit_training`` and ``peft.get_peft_model`` leave on the GPU, without
bitsandbytes (it needs a GPU). Sources, read for this module (bitsandbytes 0.49.2; peft 0.21;
transformers 5.23):

* Storage (``bitsandbytes/functional.py`` ``quantize_4bit``, ``_ops.py`` fake kernels): the
  packed weight is uint8 ``((n + 1) // 2, 1)`` for ``n = out x in``; one absmax per block of 64
  elements, fp32; with double quantization (``compress_statistics``) the absmax is stored as
  uint8 and quantized again in blocks of 256 (fp32 absmax per block, a 256-entry fp32 code book
  copied per layer, a 0-dim fp32 offset). Every layer holds its own 16-entry fp32 NF4 code book.
* Compute (``autograd/_functions.py`` ``MatMul4Bit``): forward dequantizes the whole weight to
  the quantized dtype (with double quantization first an fp32 absmax of ``n / 64`` elements),
  casts to the input dtype, runs ``F.linear`` and frees the copy; it keeps only the packed
  weight for backward (``ctx.tensors = (None, B)``), so nothing per token is saved. Backward
  dequantizes again for ``grad_input = grad_output @ W``. One-token inputs without grad take
  the ``gemv_4bit`` kernel, which reads the packed weight directly.
* ``bnb.nn.Linear4bit.forward``: casts the input to ``compute_dtype`` and the output back to
  the input dtype, and casts its bias to the input dtype in place, once.
* Which linears (``transformers/integrations/bitsandbytes.py`` ``replace_with_bnb_linear``,
  ``quantizers/base.py`` ``get_keys_to_not_convert``): every module whose type is exactly
  ``nn.Linear`` (or GPT-2's ``Conv1D``) except the output embedding, tied modules, the module
  of the last parameter and ``_keep_in_fp32_modules``; ``llm_int8_skip_modules`` replaces the
  defaults. LoRA targets are not special: every such linear is quantized.
* ``peft.tuners.lora.bnb.Linear4bit.forward``: the base output is cloned ("defensively"), and the
  adapter input is cast only when autocast is off.
* ``peft.prepare_model_for_kbit_training`` (run here for real, on meta): freezes the model and
  casts every fp16/bf16 parameter that is not 4-bit (embeddings, norms, LM head, biases) to fp32.
  It is the step of PEFT's and transformers' QLoRA guides, the QLoRA paper's script and TRL's
  trainers up to 0.26 (TRL 0.27+ skips it and keeps them bf16): ``prepare_kbit=False``.

bitsandbytes >= 0.50 runs a fused 4-bit GEMM without the dequantized copy for at most 1,536
tokens per matmul on some GPUs; past that (training at batch x seq > 1536) it dequantizes as here.
"""

from __future__ import annotations

import math
import types
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vramlens.model.quant_formats import QUANT_FORMATS
from vramlens.resolve.kbit import BNB_4BIT_QUANTS
from vramlens.workload.options import Method, Mode, Quant

__all__ = [
    "Nf4Linear",
    "Nf4Settings",
    "nf4_linear_bytes",
    "nf4_settings",
    "nf4_tensor_shapes",
    "quant_note",
    "quantize_model",
    "use_bnb_lora_forward",
]

#: Entries of the NF4 code book each layer's quant state holds (fp32).
NF4_CODE_ENTRIES = 16
#: Entries of bitsandbytes' dynamic 8-bit map copied into each nested quant state (fp32).
NESTED_CODE_ENTRIES = 256
_NF4_QUANTS = BNB_4BIT_QUANTS
#: Whether simulated QLoRA training runs ``peft.prepare_model_for_kbit_training`` (PEFT's and
#: transformers' QLoRA guides, the QLoRA paper's script, TRL <= 0.26); False models TRL >= 0.27,
#: which skips it. The workload contract has no key for this; tests switch it.
PREPARE_KBIT_TRAINING = True


@dataclass(frozen=True, kw_only=True)
class Nf4Settings:
    """How the 4-bit linears of one model are stored and computed."""

    double_quant: bool
    """Nested quantization of the absmax (``bnb_4bit_use_double_quant``; workload ``nf4-dq``)."""
    compute_dtype: Any
    """``bnb_4bit_compute_dtype``: the dtype of the input and of the dequantized weight in matmuls."""
    blocksize: int = 64
    """Elements per absmax (bitsandbytes' 4-bit default)."""
    nested_blocksize: int = 256
    """Absmax values per second-level scale (bitsandbytes' fixed value)."""
    skip_modules: tuple[str, ...] = ()
    """``llm_int8_skip_modules``: replaces transformers' default skips when not empty."""
    prepare_kbit: bool = False
    """Run ``peft.prepare_model_for_kbit_training`` (the QLoRA training recipe)."""


def nf4_settings(workload: Any, *, dtype: Any, weights: Any = None, compute: str | None = None) -> Nf4Settings | None:
    """The NF4 storage a workload runs, or None for unquantized weights.

    Training: ``method qlora`` (``quant`` none means nf4-dq, the QLoRA paper's setting) or
    ``method lora`` with ``quant`` nf4/nf4-dq; the compute dtype is the frozen weights' dtype
    ``dtype`` (the recipe's ``bnb_4bit_compute_dtype=bfloat16``). Inference: ``weights`` (a
    ``WeightFormat`` of scheme bnb-4bit) with the checkpoint's ``compute`` dtype name if given.
    Other quantization is refused by the callers' checks before this runs.
    """
    if workload.mode is Mode.TRAIN:
        adapters = workload.method in (Method.LORA, Method.QLORA)
        if not adapters or (workload.method is Method.LORA and workload.quant not in _NF4_QUANTS):
            return None
        double = workload.quant is Quant.NONE or QUANT_FORMATS[workload.quant].double_quant  # qlora alone: nf4-dq
        return Nf4Settings(double_quant=double, compute_dtype=dtype, prepare_kbit=PREPARE_KBIT_TRAINING)
    if weights is None or weights.scheme.value != "bnb-4bit":
        return None
    chosen = getattr(torch, compute) if compute in ("bfloat16", "float16", "float32") else dtype
    return Nf4Settings(double_quant=weights.double_quant, compute_dtype=chosen, skip_modules=weights.skip_modules)


def nf4_tensor_shapes(
    out_features: int, in_features: int, *, double_quant: bool, blocksize: int = 64, nested_blocksize: int = 256
) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Shape and dtype of every tensor bitsandbytes keeps for one ``out x in`` NF4 weight.

    ``weight`` packs two 4-bit values per uint8 byte, ``(n + 1) // 2`` of them; ``absmax`` has
    ``ceil(n / blocksize)`` entries (uint8 with double quantization, else fp32); ``code`` is
    the NF4 code book. With double quantization also ``offset`` (0-dim fp32), ``nested_absmax``
    (``ceil(blocks / nested_blocksize)`` fp32) and ``nested_code`` (256 fp32). Source:
    bitsandbytes ``functional.quantize_4bit`` / ``quantize_blockwise`` and their fake kernels.
    """
    n = out_features * in_features
    blocks = math.ceil(n / blocksize)
    shapes: dict[str, tuple[tuple[int, ...], Any]] = {
        "weight": (((n + 1) // 2, 1), torch.uint8),
        "absmax": ((blocks,), torch.uint8 if double_quant else torch.float32),
        "code": ((NF4_CODE_ENTRIES,), torch.float32),
    }
    if double_quant:
        shapes["offset"] = ((), torch.float32)
        shapes["nested_absmax"] = ((math.ceil(blocks / nested_blocksize),), torch.float32)
        shapes["nested_code"] = ((NESTED_CODE_ENTRIES,), torch.float32)
    return shapes


def nf4_linear_bytes(out_features: int, in_features: int, *, double_quant: bool, blocksize: int = 64) -> int:
    """Bytes of one NF4 weight with its quant state (raw tensor bytes, no allocator rounding)."""
    shapes = nf4_tensor_shapes(out_features, in_features, double_quant=double_quant, blocksize=blocksize)
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in shapes.values())


class _MatMul4Bit(torch.autograd.Function):
    """bitsandbytes' ``MatMul4Bit`` in memory: dequantize, linear, free; backward dequantizes again."""

    @staticmethod
    def forward(ctx: Any, inputs: Any, packed: Any, bias: Any, layer: Nf4Linear) -> Any:
        """``F.linear(A, dequantize_4bit(B).to(A.dtype), bias)``; saves no tensor of its own."""
        output = nn.functional.linear(inputs, layer.dequantize().to(inputs.dtype), bias)
        ctx.layer = layer  # bnb keeps the quant state and the packed weight as ctx attributes
        ctx.bias_dtype = None if bias is None else bias.dtype
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        """``grad_A = grad_output @ dequantize_4bit(B).to(grad_output.dtype)``; no weight gradient."""
        grad_input = grad_bias = None
        if ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum(0, dtype=ctx.bias_dtype)
        if ctx.needs_input_grad[0]:
            grad_input = torch.matmul(grad_output, ctx.layer.dequantize().to(grad_output.dtype))
        return grad_input, None, grad_bias, None


class Nf4Linear(nn.Linear):
    """A ``bnb.nn.Linear4bit`` stand-in: the packed weight and quant state as frozen parameters.

    A subclass of ``nn.Linear`` so PEFT wraps it like any linear layer (its LoRA forward is
    then replaced by :func:`use_bnb_lora_forward`). The quant-state tensors are parameters
    with ``requires_grad=False`` so that ``to_empty`` materializes them and the tracker counts
    them as ``parameters``; bitsandbytes keeps them in a ``QuantState`` beside the weight.
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool, dtype: Any, settings: Nf4Settings) -> None:
        """Empty meta tensors of bitsandbytes' sizes; ``dtype`` is the weights' dtype before quantization."""
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.quant_dtype, self.compute_dtype = dtype, settings.compute_dtype
        self.double_quant = settings.double_quant
        self.blocksize = settings.blocksize
        self.blocks = math.ceil(in_features * out_features / settings.blocksize)
        shapes = nf4_tensor_shapes(
            out_features,
            in_features,
            double_quant=settings.double_quant,
            blocksize=settings.blocksize,
            nested_blocksize=settings.nested_blocksize,
        )
        for name, (shape, element) in shapes.items():
            tensor = torch.empty(shape, dtype=element, device="meta")
            self.register_parameter(name, nn.Parameter(tensor, requires_grad=False))
        tensor = torch.empty(out_features, dtype=dtype, device="meta")
        self.register_parameter("bias", nn.Parameter(tensor) if bias else None)

    def dequantize(self) -> Any:
        """A new ``out x in`` weight in the quantized dtype (``functional.dequantize_4bit``).

        With double quantization the absmax is dequantized first into a new fp32 tensor
        (``dequantize_blockwise``; the offset is then added in place), alive until the weight exists.
        """
        device = self.weight.device
        absmax = torch.empty(self.blocks, dtype=torch.float32, device=device) if self.double_quant else None
        weight = torch.empty((self.out_features, self.in_features), dtype=self.quant_dtype, device=device)
        del absmax
        return weight

    def forward(self, x: Any) -> Any:
        """``bnb.nn.Linear4bit.forward``: bias to the input dtype (once, in place), input to the
        compute dtype, the 4-bit matmul, output back to the input dtype."""
        if self.bias is not None and self.bias.dtype != x.dtype:
            self.bias.data = self.bias.data.to(x.dtype)
        input_dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        return self._matmul(x, bias).to(input_dtype)

    def _matmul(self, x: Any, bias: Any) -> Any:
        """``bnb.matmul_4bit``: one token without grad (and ``in`` a multiple of the block size)
        takes ``gemv_4bit`` (no dequantized copy; the nested absmax is still dequantized),
        everything else ``MatMul4Bit``."""
        if x.numel() == x.shape[-1] and not x.requires_grad and x.shape[-1] % self.blocksize == 0:
            absmax = torch.empty(self.blocks, dtype=torch.float32, device=x.device) if self.double_quant else None
            out = torch.empty((*x.shape[:-1], self.out_features), dtype=x.dtype, device=x.device)
            del absmax
            if bias is not None:
                out += bias
            return out
        return _MatMul4Bit.apply(x, self.weight, bias, self)  # type: ignore[no-untyped-call]


def _skipped(model: Any, settings: Nf4Settings) -> list[str]:
    """Module names transformers' bnb quantizer leaves unquantized (``get_modules_to_not_convert``):
    ``llm_int8_skip_modules`` if given, else its defaults (output embedding, tied and last
    modules), plus the model class's ``_keep_in_fp32_modules``."""
    if settings.skip_modules:
        names = list(settings.skip_modules)
    else:
        try:
            from transformers.quantizers.base import get_keys_to_not_convert

            names = list(get_keys_to_not_convert(model))
        except (ImportError, AttributeError):
            head = getattr(model, "get_output_embeddings", lambda: None)()
            names = [name for name, module in model.named_modules() if head is not None and module is head]
    return names + list(getattr(model, "_keep_in_fp32_modules", None) or ())


def _converts(name: str, skipped: list[str]) -> bool:
    """transformers' ``should_convert_module``: a skip entry matches at a module boundary, as a
    regular expression from the start, or as a suffix."""
    try:
        from transformers.quantizers.quantizers_utils import should_convert_module

        return bool(should_convert_module(name, skipped))
    except ImportError:
        return not any(name == key or name.startswith(key + ".") or name.endswith(key) for key in skipped)


def _features(module: Any) -> tuple[int, int] | None:
    """(in, out) features of a module bitsandbytes would replace: exactly ``nn.Linear`` or ``Conv1D``."""
    if type(module) is nn.Linear:
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        rows, cols = module.weight.shape
        return int(rows), int(cols)
    return None


def quantize_model(model: Any, settings: Nf4Settings) -> Any:
    """Replace the linears bitsandbytes quantizes with :class:`Nf4Linear` (on meta), then, for
    training, run ``peft.prepare_model_for_kbit_training`` as the QLoRA recipe does."""
    skipped = _skipped(model, settings)
    for name, module in list(model.named_modules()):
        features = _features(module)
        if features is None or not _converts(name, skipped):
            continue
        dtype = module.weight.dtype
        layer = Nf4Linear(*features, bias=module.bias is not None, dtype=dtype, settings=settings)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, layer)
    model.is_loaded_in_4bit = True
    if settings.prepare_kbit:
        from peft import prepare_model_for_kbit_training

        prepare: Any = prepare_model_for_kbit_training
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = prepare(model, use_gradient_checkpointing=False)
        model._vramlens_prepared_kbit = True
    return model


def quant_note(model: Any) -> str | None:
    """The assumption to report for a model with :class:`Nf4Linear` layers (None without)."""
    layers = [module for module in model.modules() if isinstance(module, Nf4Linear)]
    if not layers:
        return None
    nested = "with" if layers[0].double_quant else "without"
    note = (
        f"quant: {len(layers)} linears as bitsandbytes NF4 ({nested} double quantization; dequantized to "
        f"{str(layers[0].compute_dtype).removeprefix('torch.')} per matmul, forward and backward)"
    )
    if getattr(model, "_vramlens_prepared_kbit", False):
        note += "; peft.prepare_model_for_kbit_training: the other fp16/bf16 weights in fp32"
    return note


def use_bnb_lora_forward(model: Any) -> int:
    """Give every PEFT LoRA linear over an :class:`Nf4Linear` the forward of PEFT's bnb
    ``Linear4bit``; returns how many were changed."""
    changed = 0
    for module in model.modules():
        if isinstance(getattr(module, "base_layer", None), Nf4Linear) and hasattr(module, "lora_A"):
            module.forward = types.MethodType(_bnb_lora_forward, module)
            changed += 1
    return changed


def _bnb_lora_forward(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
    """``peft.tuners.lora.bnb.Linear4bit.forward`` for plain LoRA adapters: the base output is
    cloned, and the adapter input is cast to the adapter dtype only without autocast (the
    simulation's CPU autocast stands for CUDA's). Other states take PEFT's own forward."""
    if self.disable_adapters or self.merged or kwargs.get("adapter_names") is not None or self.lora_variant:
        return type(self).forward(self, x, *args, **kwargs)
    result = self.base_layer(x, *args, **kwargs).clone()
    for name in self.active_adapters:
        if name not in self.lora_A:
            continue
        lora_a, lora_b = self.lora_A[name], self.lora_B[name]
        convert = not torch.is_autocast_enabled(x.device.type)
        expected = result.dtype
        adapter_input = self._cast_input_dtype(x, lora_a.weight.dtype) if convert else x
        output = lora_b(lora_a(self.lora_dropout[name](adapter_input))) * self.scaling[name]
        result = result + (output.to(expected) if convert else output)
    return result
