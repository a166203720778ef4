"""JSON-safe dictionaries of a :class:`ModelSpec` (what ``vramlens models show --format json`` prints)."""

from __future__ import annotations

import dataclasses
from typing import Any

from vramlens.dtypes import bytes_for
from vramlens.model.spec import ModelSpec

__all__ = ["spec_summary", "spec_to_dict", "weight_bytes"]


def _plain(value: Any) -> Any:
    """Dataclasses and enums to plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value


def _mixers(spec: ModelSpec) -> list[str]:
    """The token-mixer kinds of the layers, in order of first appearance."""
    return list(dict.fromkeys(layer.mixer.value for layer in spec.layers))


def weight_bytes(spec: ModelSpec) -> int | None:
    """Bytes of all parameters at the checkpoint dtype, or None for quantized checkpoints
    (their size depends on which modules are quantized; see the checkpoint summary or an estimate)."""
    if spec.quantization is not None:
        return None
    return bytes_for(spec.num_parameters, spec.dtype)


def _generic(spec: ModelSpec) -> dict[str, Any] | None:
    """For a model read from transformers' code: the class and each layer kind (None for native families)."""
    layout = spec.generic
    if layout is None:
        return None
    counts = layout.kind_counts()
    return {
        "model_class": layout.model_class,
        "auto_class": layout.auto_class,
        "layer_kinds": [
            {
                "name": kind.name,
                "layers": counts.get(index, 0),
                "parameters_per_layer": kind.elements,
                "components": {component.value: count for component, count in kind.components},
                "linears": [shape.name for shape in kind.linears],
            }
            for index, kind in enumerate(layout.kinds)
        ],
        "num_experts": layout.num_experts,
        "experts_per_token": layout.experts_per_token,
    }


def spec_summary(spec: ModelSpec) -> dict[str, Any]:
    """The headline numbers of a spec: one row of ``models list --format json``."""
    return {
        "name": spec.name,
        "hf_id": spec.hf_id,
        "model_type": spec.model_type,
        "parameters": spec.num_parameters,
        "active_parameters": spec.active_parameters,
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_heads if spec.attention is not None else None,
        "num_key_value_heads": spec.num_kv_heads if spec.attention is not None else None,
        "head_dim": spec.head_dim if spec.attention is not None else None,
        "attention": spec.attention.kind if spec.attention is not None else None,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "dtype": spec.dtype,
    }


def spec_to_dict(spec: ModelSpec) -> dict[str, Any]:
    """Every field of a spec plus derived counts, JSON-safe."""
    windows = [layer.window for layer in spec.layers]
    return {
        **spec_summary(spec),
        "architecture": spec.architecture,
        "source": spec.source,
        "parameter_breakdown": spec.parameter_breakdown.as_dict(),
        "weight_bytes": weight_bytes(spec),
        "intermediate_size": spec.mlp.intermediate_size if spec.mlp else None,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "attention_spec": _plain(spec.attention),
        "described_from": _generic(spec),
        "mlp": _plain(spec.mlp),
        "moe": _plain(spec.moe),
        "mamba": _plain(spec.mamba),
        "linear_attention": _plain(spec.linear_attention),
        "layers": {
            "mixers": {kind: sum(1 for layer in spec.layers if layer.mixer == kind) for kind in _mixers(spec)},
            "moe": spec.num_moe_layers,
            "dense": sum(1 for layer in spec.layers if layer.ffn.value == "dense"),
            "sliding_window": sum(1 for w in windows if w is not None),
            "global_attention": sum(1 for layer in spec.layers if layer.attends and layer.window is None),
            "windows": windows,
            "chunks": [layer.chunk for layer in spec.layers],
            "rope": [layer.rope for layer in spec.layers],
        },
        "norm": {**_plain(spec.norm), "per_layer": spec.norms_per_layer, "final": spec.final_norm},
        "position": _plain(spec.position),
        "sliding_window": spec.sliding_window,
        "parallel_residual": spec.parallel_residual,
        "dropout": {
            "attention": spec.attention.dropout if spec.attention is not None else None,
            "hidden": spec.hidden_dropout,
            "embedding": spec.embedding_dropout,
        },
        "final_logit_softcap": spec.final_logit_softcap,
        "quantization": _plain(spec.quantization),
        "extra_parameters": dict(spec.extra_parameters),
        "vision": _plain(spec.vision),
        "checkpoint": spec.checkpoint.to_dict() if spec.checkpoint is not None else None,
        "assumptions": list(spec.assumptions),
    }
