"""Build the real transformers model of a spec on fake CPU tensors (no weights, no memory).

Route (measured in ``docs/research/torch-cpu-probes.md``, sections 1, 2 and 6): the model is
built on the ``meta`` device from the spec's ``config.json`` with the workload's dtype, PEFT
adapters are added while still on meta (PEFT cannot swap fake parameters), and the result is
materialized with ``to_empty(device="cpu")`` inside a ``FakeTensorMode``. Fake CUDA does
not work on a CPU-only torch (backward needs a device guard), so the simulation runs fake
*CPU* tensors: CPU SDPA takes the flash path (output + logsumexp, no s x s matrix), the
same memory shape as CUDA flash attention.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from vramlens._extras import require
from vramlens.errors import InputError
from vramlens.model.spec import ModelSpec
from vramlens.simulator._cuda_sdpa import cuda_runs_math, cuda_sdpa_backend
from vramlens.workload.options import AttentionImpl, Precision
from vramlens.workload.spec import ALL_LINEAR, Workload

__all__ = [
    "KERNEL_STAND_IN",
    "SimulationError",
    "attention_implementation",
    "attention_note",
    "build_model",
    "cuda_code_paths",
    "cuda_sdpa_backend",
    "hf_config",
    "real_code_paths",
    "torch_dtype",
]

#: Attention kernels as transformers names them; flash and memory-efficient map to SDPA,
#: whose CPU flash kernel has CUDA flash attention's memory shape.
_ATTENTION = {
    AttentionImpl.AUTO: "sdpa",
    AttentionImpl.FLASH: "sdpa",
    AttentionImpl.EFFICIENT: "sdpa",
    AttentionImpl.SDPA: "sdpa",
    AttentionImpl.EAGER: "eager",
}


class SimulationError(InputError):
    """The simulator cannot run this model or workload; the message suggests ``estimate``."""


@contextlib.contextmanager
def real_code_paths() -> Iterator[None]:
    """Make transformers take, on fake CPU tensors, the branch a real CUDA run takes.

    * transformers treats fake tensors as tracing and then skips value checks. One of them
      changes memory: ``masking_utils.find_packed_sequence_indices`` looks for packed
      sequences in ``position_ids``; on real unpacked inputs it returns None (SDPA's
      ``is_causal``, no mask), on fake ones it returns a mask and a 4-D attention mask
      gets built. Simulated inputs are one sequence per row, so the real answer is None.
      (Found by comparing a fake run with a real one; +2 MiB on a 4 x 128 batch.)
    * Dropout, through :func:`cuda_code_paths`.
    """
    from unittest import mock  # here: unittest imports asyncio, which nothing else the package loads needs

    masking_utils = require("transformers.masking_utils", purpose="vramlens simulate")
    with (
        mock.patch.object(masking_utils, "find_packed_sequence_indices", lambda position_ids: None),
        cuda_code_paths(),
    ):
        yield


@contextlib.contextmanager
def cuda_code_paths() -> Iterator[None]:
    """Run dropout (and grouped matmuls) as CUDA does, not as the CPU does.

    * ``F.dropout`` in training with 0 < p < 1: on CUDA ``at::dropout`` takes the fused
      ``native_dropout`` and keeps a 1-byte bool mask for backward; on CPU it multiplies by
      a noise tensor in the input's dtype (2-4 bytes per element kept). Source:
      ``aten/src/ATen/native/Dropout.cpp`` (``is_fused_kernel_acceptable``).
    * ``F.scaled_dot_product_attention`` with ``dropout_p > 0``: CUDA's flash and
      memory-efficient kernels drop out from a random seed and keep no mask; the CPU falls
      back to the math kernel and keeps s x s fp32 tensors. The call runs with
      ``dropout_p=0`` (same saved tensors as the CUDA kernels), unless CUDA runs it on the math
      backend (below), whose dropout keeps a 1-byte mask and the dropped-out probabilities.
    (Found by the GPT-2 agreement cases, dropout 0.1: the fake run was 36-54% above a
    CUDA-shaped estimate.)
    * ``F.scaled_dot_product_attention`` with fp32 queries (autocast off), grouped KV heads,
      ``enable_gqa`` and no mask: no fused CUDA kernel takes it (flash and cuDNN: fp16/bf16; memory-efficient: no GQA),
      so CUDA runs the math backend, which keeps the s x s probabilities; the CPU's flash kernel
      takes it. The call runs ``aten._scaled_dot_product_attention_math``
      (:mod:`vramlens.simulator._cuda_sdpa`; measured on an H200, QLoRA without autocast).
    * ``grouped_mm`` in fp32/fp16 (MoE experts after QLoRA's k-bit preparation): CUDA runs a
      per-group fallback whose meta function fake tensors lack
      (:mod:`vramlens.simulator._grouped_mm`).
    """
    from unittest import mock

    from vramlens.simulator._grouped_mm import any_dtype_grouped_mm

    torch = require("torch", purpose="vramlens simulate")
    functional = torch.nn.functional
    dropout = functional.dropout

    def cuda_dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if training and 0 < p < 1 and not inplace:
            return torch.ops.aten.native_dropout(input, p, True)[0]
        return dropout(input, p, training, inplace)

    def flash_attention(*args: Any, dropout_p: float = 0.0, **kwargs: Any) -> Any:
        kept = dropout_p if cuda_runs_math(torch, *args, **kwargs) else 0.0  # only the math backend keeps its tensors
        return attention(*args, dropout_p=kept, **kwargs)

    with cuda_sdpa_backend():
        attention = functional.scaled_dot_product_attention
        with (
            mock.patch.object(functional, "dropout", cuda_dropout),
            mock.patch.object(functional, "scaled_dot_product_attention", flash_attention),
            any_dtype_grouped_mm(),
        ):
            yield


def hf_config(spec: ModelSpec, attention: AttentionImpl) -> Any:
    """The transformers config object of ``spec`` (from the ``config.json`` it was parsed from)."""
    transformers = require("transformers", purpose="vramlens simulate")
    if spec.config is None:
        raise SimulationError(
            f"model: {spec.name} has no config.json to build from (a spec made by hand); "
            "pass a catalog name, a config path or a config dict, or use `vramlens estimate`"
        )
    config = {key: value for key, value in dict(spec.config).items() if key not in ("auto_map", "quantization_config")}
    model_type = str(config.pop("model_type", spec.model_type))
    try:
        built = transformers.AutoConfig.for_model(model_type, **config)
    except (ValueError, KeyError) as error:
        raise SimulationError(
            f"model_type: transformers {transformers.__version__} cannot build {model_type!r} ({error}); "
            "use `vramlens estimate`"
        ) from None
    built._attn_implementation = attention_implementation(attention)
    built.use_cache = False
    return built


def attention_implementation(attention: AttentionImpl) -> str:
    """transformers' ``attn_implementation`` for a workload's attention kernel."""
    return _ATTENTION[attention]


def torch_dtype(precision: Precision, element_bytes: float) -> Any:
    """The torch dtype of weights stored at ``element_bytes`` under ``precision``."""
    torch = require("torch", purpose="vramlens simulate")
    if element_bytes == 4:
        return torch.float32
    half = precision in (Precision.FP16, Precision.MIXED_FP16)
    return torch.float16 if half else torch.bfloat16


#: Name under which the simulator registers transformers' SDPA attention for models whose
#: class refuses SDPA (Gemma 2: soft-capping). On GPUs those models run flash-attention 2,
#: which soft-caps inside the kernel and keeps the same tensors as SDPA's flash path.
KERNEL_STAND_IN = "vramlens_kernel"


def _register_stand_in() -> None:
    transformers = require("transformers", purpose="vramlens simulate")
    masking_utils = require("transformers.masking_utils", purpose="vramlens simulate")
    sdpa = require("transformers.integrations.sdpa_attention", purpose="vramlens simulate")

    def stand_in(*args: Any, softcap: Any = None, **kwargs: Any) -> Any:
        return sdpa.sdpa_attention_forward(*args, **kwargs)

    transformers.AttentionInterface.register(KERNEL_STAND_IN, stand_in)
    masking_utils.AttentionMaskInterface.register(KERNEL_STAND_IN, masking_utils.sdpa_mask)


def attention_note(model: Any) -> str | None:
    """The assumption to report when the model runs the SDPA stand-in for its GPU kernel."""
    if getattr(model.config, "_attn_implementation", None) != KERNEL_STAND_IN:
        return None
    from vramlens.resolve.styles import HF_STYLES, HfStyle

    kernel = HF_STYLES.get(getattr(model.config, "model_type", ""), HfStyle()).gpu_kernel
    return (
        f"attention: {type(model).__name__} refuses SDPA in transformers; simulated with SDPA's flash path "
        f"standing in for {kernel} (the same saved tensors; soft-capping and sinks do not change memory)"
    )


def _from_config(spec: ModelSpec, config: Any, dtype: Any) -> Any:
    """The model class the spec describes: a multimodal spec (``spec.vision``) is the whole
    image-text-to-text model, vision tower included (``AutoModelForCausalLM`` maps some of
    these types to their text model alone: Llama 4); anything else the causal LM."""
    torch = require("torch", purpose="vramlens simulate")
    transformers = require("transformers", purpose="vramlens simulate")
    # A model described from its code is built by the auto class its reader used; a native multimodal
    # spec (``spec.vision``) is the whole image-text-to-text model, vision tower included
    # (``AutoModelForCausalLM`` maps some of these types to their text model alone: Llama 4).
    if spec.generic:
        auto = getattr(transformers, spec.generic.auto_class)
    elif spec.vision is not None:
        auto = transformers.AutoModelForImageTextToText
    else:
        auto = transformers.AutoModelForCausalLM
    try:
        with warnings.catch_warnings(), torch.device("meta"), _no_meta_init(torch):
            warnings.simplefilter("ignore")
            return auto.from_config(config, dtype=dtype)
    except (ValueError, KeyError, AttributeError, TypeError, RuntimeError) as error:
        if "scaled_dot_product_attention" in str(error) and config._attn_implementation == "sdpa":
            _register_stand_in()
            config._attn_implementation = KERNEL_STAND_IN
            return _from_config(spec, config, dtype)
        raise SimulationError(
            f"model: transformers cannot build {spec.name} from its config ({type(error).__name__}: {error}); "
            "use `vramlens estimate`"
        ) from None


#: ``torch.nn.init``'s in-place initialisers: each fills its tensor and returns it.
_INITIALISERS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "eye_",
    "dirac_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "orthogonal_",
    "sparse_",
)


@contextlib.contextmanager
def _no_meta_init(torch: Any) -> Iterator[None]:
    """While a model is built on the meta device, ``torch.nn.init``'s initialisers return their
    tensor as it is: a meta tensor has no values to fill, but each call still runs through the
    device mode and the meta decompositions (about 40% of building a 32-layer model). Shapes,
    dtypes and the module tree are unchanged; ``to_empty`` makes the real (fake) tensors after.
    Modules that imported an initialiser by name keep the real one (slower, the same model)."""

    from unittest import mock

    def unchanged(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return tensor

    with contextlib.ExitStack() as stack:
        for name in _INITIALISERS:
            if hasattr(torch.nn.init, name):
                stack.enter_context(mock.patch.object(torch.nn.init, name, unchanged))
        yield


def build_model(
    spec: ModelSpec,
    workload: Workload,
    *,
    dtype: Any,
    attention: AttentionImpl,
    fake_mode: Any,
    weights: Any = None,
    prepare: Callable[[Any], None] | None = None,
) -> Any:
    """The model on fake CPU tensors, with LoRA adapters when the workload asks for them and
    bitsandbytes NF4 linears for QLoRA (or inference ``weights`` of scheme bnb-4bit), as
    :mod:`vramlens.simulator.quant` describes. ``prepare`` edits the model while it is still
    on the meta device (the recipe tracer keeps a few of its layers)."""
    from vramlens.simulator.quant import nf4_settings, quantize_model, use_bnb_lora_forward

    model = _from_config(spec, hf_config(spec, attention), dtype)
    if prepare is not None:
        prepare(model)
    if workload.method.value in ("lora", "qlora") and workload.lora.targets == ALL_LINEAR:
        _check_all_linear(model)
    compute = spec.quantization.compute_dtype if spec.quantization is not None else None
    nf4 = nf4_settings(workload, dtype=dtype, weights=weights, compute=compute)
    if nf4 is not None:
        model = quantize_model(model, nf4)
    if workload.method.value in ("lora", "qlora"):
        model = _with_lora(model, workload)
        if nf4 is not None:
            use_bnb_lora_forward(model)
    with fake_mode:
        model.to_empty(device="cpu")
        # to_empty gives every module its own new tensor, so tied weights come apart; re-tie.
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        _retie(base, cut=prepare is not None)
    return model


def _check_all_linear(model: Any) -> None:
    """Refuse ``all-linear`` LoRA on a model with an ``nn.Linear`` subclass that has its own
    forward (Llama 4's router returns a tuple): PEFT wraps it and its forward fails."""
    torch = require("torch", purpose="vramlens simulate")
    linear = torch.nn.Linear
    odd = sorted(
        {type(m).__name__ for m in model.modules() if isinstance(m, linear) and type(m).forward is not linear.forward}
    )
    if odd:
        raise SimulationError(
            f"lora.targets: all-linear would wrap {', '.join(odd)} (an nn.Linear with its own forward), which PEFT's "
            "LoRA forward cannot run; list the modules to adapt"
        )


def _retie(model: Any, *, cut: bool) -> None:
    """Re-tie weights after ``to_empty``. In a model cut down to a few layers (recipes), ties
    that name layers no longer there (Zamba's block shared by every hybrid layer: the same
    module object in each kept layer, materialized once) cannot be resolved; then only the
    input embedding and the LM head are re-tied, as the config asks. A head wrapped by PEFT
    (``lora.targets`` naming it) is unwrapped while transformers ties by parameter name
    (``lm_head.weight``: PEFT keeps it as ``lm_head.base_layer.weight``)."""
    with _unwrapped_head(model):
        _tie(model, cut=cut)


@contextlib.contextmanager
def _unwrapped_head(model: Any) -> Iterator[None]:
    """Put the base layer of a PEFT-wrapped output projection in its place for the block."""
    head = model.get_output_embeddings()
    base = getattr(head, "base_layer", None)
    if base is None:
        yield
        return
    name = next(name for name, module in model.named_modules() if module is head)
    parent = model.get_submodule(name.rpartition(".")[0])
    attribute = name.rpartition(".")[2]
    setattr(parent, attribute, base)
    try:
        yield
    finally:
        setattr(parent, attribute, head)


def _tie(model: Any, *, cut: bool) -> None:
    try:
        model.tie_weights()
    except ValueError:
        if not cut:
            raise
        head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
        text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        if head is not None and embedding is not None and getattr(text, "tie_word_embeddings", False):
            head.weight = embedding.weight


def _with_lora(model: Any, workload: Workload) -> Any:
    peft = require("peft", purpose="vramlens simulate (LoRA)")
    lora = workload.lora
    targets: Any = "all-linear" if lora.targets == ALL_LINEAR else list(lora.targets)
    config = peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        modules_to_save=list(lora.modules_to_save) or None,
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return peft.get_peft_model(model, config)
    except ValueError as error:
        raise SimulationError(f"lora.targets: PEFT cannot apply them to this model ({error})") from None
