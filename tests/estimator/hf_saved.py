"""Ground truth for activation recipes: the tensors autograd saves inside one decoder layer
of a real transformers model, on CPU.

"Where am I" comes from forward hooks on the decoder layer; "what was saved" from
``torch.autograd.graph.saved_tensors_hooks``. Only tensors still held after the forward
count: a node whose outputs nobody uses (the discarded values of a ``topk`` in a router, the
delta rule's final state when no cache asks for it) is freed with what it saved, and its
storage's address can be reused by a later tensor, so addresses are read only once the
forward is over (weak references to the packed tensors). A saved tensor is counted once per
storage; parameters, and storages another layer also saved (rotary tables and attention masks
shared by all layers, or by all attention layers of a hybrid), are left out, as vramlens counts
those outside the layers. Needs the [hf] extra; imported by tests only.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import warnings
import weakref
from typing import Any


def _build(config: dict[str, Any], dtype: Any, attention: str) -> Any:
    import transformers

    config = dict(config)
    model_type = config.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **config)
    hf_config._attn_implementation = attention
    # HF Trainer sets ``model.config.use_cache = args.use_cache`` (default False; trainer.py,
    # "Finalize"): no DynamicCache in the training forward. With a cache, keys and values are
    # its concatenated copies, which changes what fused-qkv families keep.
    hf_config.use_cache = False
    image_text = transformers.models.auto.modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    auto = transformers.AutoModelForImageTextToText if model_type in image_text else transformers.AutoModelForCausalLM
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = auto.from_config(hf_config, dtype=dtype)
    model.train()
    return model


def _decoder_layers(model: Any) -> Any:
    """The text decoder's layer list (a multimodal model's vision encoder has one too)."""
    found = [(name, module) for name, module in model.named_modules() if name.endswith("layers") or name.endswith(".h")]
    for name, module in found:
        if "language_model" in name:
            return module
    if found:
        return found[0][1]
    raise LookupError("no decoder layer list found")


def layer_saved_bytes_per_token(
    config: dict[str, Any],
    *,
    dtype: str = "bfloat16",
    attention: str = "sdpa",
    layer: int = 1,
    batch: int = 2,
    seq: int = 64,
    autocast: bool = False,
    frozen: bool = False,
    liger: bool = False,
) -> float:
    """Bytes per token autograd keeps for decoder layer ``layer`` in one forward pass: the
    difference between a forward of ``2 * batch`` and of ``batch`` sequences, per token, so
    that tensors of parameter size (Gemma's ``1 + weight``) drop out. ``frozen``: every
    parameter frozen and the input embeddings requiring grad (a LoRA run without its adapters).
    ``liger``: the model patched with CPU stand-ins of Liger-Kernel's functions (liger_standins.py).
    One forward measures every layer: the layers of a settings' forward are kept for the next call."""
    key = json.dumps(config, sort_keys=True)
    double = _saved_by_layer(key, dtype, attention, 2 * batch, seq, autocast, frozen, liger)
    single = _saved_by_layer(key, dtype, attention, batch, seq, autocast, frozen, liger)
    return (double[layer] - single[layer]) / (batch * seq)


@functools.lru_cache(maxsize=8)
def _saved_by_layer(
    config_json: str,
    dtype: str,
    attention: str,
    batch: int,
    seq: int,
    autocast: bool,
    frozen: bool,
    liger: bool = False,
) -> tuple[int, ...]:
    """Bytes each decoder layer keeps (its own storages) in one forward of ``config_json``'s model."""
    import torch

    from vramlens.simulator.build import cuda_sdpa_backend

    torch.manual_seed(0)
    model = _build(json.loads(config_json), getattr(torch, dtype), attention)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    packed: list[tuple[int, Any]] = []
    current: list[int | None] = [None]
    layers = _decoder_layers(model)
    for index, module in enumerate(layers):
        module.register_forward_pre_hook(lambda _m, _a, i=index: current.__setitem__(0, i))
        module.register_forward_hook(lambda _m, _a, _o: current.__setitem__(0, None))

    def pack(tensor: Any) -> Any:
        if current[0] is not None:
            packed.append((current[0], weakref.ref(tensor)))
        return tensor

    ids = torch.randint(0, model.config.get_text_config().vocab_size, (batch, seq))
    inputs: dict[str, Any] = {"input_ids": ids}
    if frozen:
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        inputs = {"inputs_embeds": model.get_input_embeddings()(ids).requires_grad_(True)}
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    patched = contextlib.nullcontext()
    if liger:
        from liger_standins import liger_applied

        patched = liger_applied(model)
    # SDPA on the backend CUDA picks (fp32 with grouped KV heads: math; the CPU's flash kernel takes it)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp, patched, cuda_sdpa_backend():
        output = model(**inputs)
    gc.collect()
    saved: dict[int, dict[int, int]] = {index: {} for index in range(len(layers))}
    for index, ref in packed:
        tensor = ref()
        if tensor is not None and tensor.untyped_storage().data_ptr() not in params:
            storage = tensor.untyped_storage()
            saved[index][storage.data_ptr()] = storage.nbytes()
    del output
    return tuple(_own_bytes(saved, layer) for layer in range(len(layers)))


def _own_bytes(saved: dict[int, dict[int, int]], layer: int) -> int:
    """Bytes of the storages ``layer`` saved that no other layer saved too (those are shared: by all
    layers, or by all attention layers of a hybrid, and vramlens counts them outside the layers)."""
    shared = {ptr for other, storages in saved.items() if other != layer for ptr in storages}
    return sum(size for ptr, size in saved[layer].items() if ptr not in shared)
