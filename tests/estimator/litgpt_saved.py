"""Ground truth for the litgpt layer style: the tensors autograd saves inside one ``Block`` of
litgpt's own LoRA ``GPT`` (``litgpt.lora``), on CPU, with ``torch.autograd.graph.saved_tensors_hooks``.

The block runs on an input that requires grad (a layer after the first), in the default dtype
given; a saved tensor counts once per storage, parameters and buffers (the rotary tables) left out.
Bytes per token are the difference between a forward of ``2 * batch`` and of ``batch`` sequences,
so that what does not grow with tokens (``lora_ind``'s clone, the norms' ``weight.float()``) drops
out. Needs litgpt (the [fidelity] extra's --no-deps step, .ci/run); imported by tests only.
"""

from __future__ import annotations

import warnings
from typing import Any

from litgpt_step import litgpt_config


def block_saved_bytes_per_token(
    *, dtype: str = "bfloat16", full: bool = False, batch: int = 2, seq: int = 64, layer: int = 1, **config: Any
) -> float:
    """Bytes per token ``Block`` ``layer`` of the tiny LoRA ``GPT`` keeps for backward (``full``: litgpt's
    plain ``GPT``, every parameter trained); ``config`` overrides fields of
    :func:`litgpt_step.litgpt_config` (``n_query_groups``, ``lora_key``, ...)."""
    double = _saved(dtype, 2 * batch, seq, layer, full, config)
    return (double - _saved(dtype, batch, seq, layer, full, config)) / (batch * seq)


def _saved(dtype: str, batch: int, seq: int, layer: int, full: bool, overrides: dict[str, Any]) -> int:
    import torch
    from litgpt import lora
    from litgpt import model as plain

    config = litgpt_config(seq)
    for name, value in overrides.items():
        setattr(config, name, value)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = plain.GPT(config) if full else lora.GPT(config)
        if not full:
            lora.mark_only_lora_as_trainable(model)
        model.train()
        owned = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        x = torch.randn(batch, seq, config.n_embd, requires_grad=True)
        cos, sin = model.cos[:seq].unsqueeze(0), model.sin[:seq].unsqueeze(0)
        storages: dict[int, int] = {}

        def pack(tensor: Any) -> Any:  # kept alive by the graph until ``out`` goes: no address reused
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model.transformer.h[layer](x, cos, sin)
        kept = sum(size for ptr, size in storages.items() if ptr not in owned)
        del out
        return kept
    finally:
        torch.set_default_dtype(previous)
