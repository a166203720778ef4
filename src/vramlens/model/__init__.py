"""Model descriptions: :class:`ModelSpec`, config parsers, the bundled catalog, checkpoint headers.

The names below are imported on first access (PEP 562), so ``import vramlens.model.spec``
loads neither the catalog nor the checkpoint reader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vramlens import _lazy

if TYPE_CHECKING:
    from vramlens.model.catalog import CatalogEntry, catalog_entries, find_entry
    from vramlens.model.families import parse_config, supported_model_types
    from vramlens.model.params import ParameterBreakdown
    from vramlens.model.quantization import QuantizationSpec, QuantMethod
    from vramlens.model.resolve import load_model, model_from_config
    from vramlens.model.safetensors import CheckpointSummary, TensorEntry, read_checkpoint
    from vramlens.model.spec import (
        AttentionSpec,
        LayerSpec,
        MlaSpec,
        MlpKind,
        MlpSpec,
        ModelSpec,
        MoeSpec,
        NormKind,
        NormSpec,
        PositionKind,
        PositionSpec,
        QKNorm,
    )

#: Public name -> the module that defines it.
_LAZY: dict[str, str] = {
    **dict.fromkeys(("CatalogEntry", "catalog_entries", "find_entry"), "vramlens.model.catalog"),
    **dict.fromkeys(("parse_config", "supported_model_types"), "vramlens.model.families"),
    "ParameterBreakdown": "vramlens.model.params",
    **dict.fromkeys(("QuantizationSpec", "QuantMethod"), "vramlens.model.quantization"),
    **dict.fromkeys(("load_model", "model_from_config"), "vramlens.model.resolve"),
    **dict.fromkeys(("CheckpointSummary", "TensorEntry", "read_checkpoint"), "vramlens.model.safetensors"),
    **dict.fromkeys(
        (
            "AttentionSpec",
            "LayerSpec",
            "MlaSpec",
            "MlpKind",
            "MlpSpec",
            "ModelSpec",
            "MoeSpec",
            "NormKind",
            "NormSpec",
            "PositionKind",
            "PositionSpec",
            "QKNorm",
        ),
        "vramlens.model.spec",
    ),
}

__all__ = [
    "AttentionSpec",
    "CatalogEntry",
    "CheckpointSummary",
    "LayerSpec",
    "MlaSpec",
    "MlpKind",
    "MlpSpec",
    "ModelSpec",
    "MoeSpec",
    "NormKind",
    "NormSpec",
    "ParameterBreakdown",
    "PositionKind",
    "PositionSpec",
    "QKNorm",
    "QuantMethod",
    "QuantizationSpec",
    "TensorEntry",
    "catalog_entries",
    "find_entry",
    "load_model",
    "model_from_config",
    "parse_config",
    "read_checkpoint",
    "supported_model_types",
]


def __getattr__(name: str) -> Any:
    """Import the module behind a public name on first access and cache the name here."""
    return _lazy.lazy_attribute(globals(), _LAZY, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
