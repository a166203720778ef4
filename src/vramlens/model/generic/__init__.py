"""Describe any architecture the installed transformers can build, from its own code.

Placeholder until the meta-device reader lands: every type without a native family is
refused in one line that names it and says what would help.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vramlens.errors import ConfigError

if TYPE_CHECKING:
    from vramlens.model.spec import ModelSpec

__all__ = ["describe_config"]


def describe_config(data: dict[str, Any], *, model_type: str, source: str) -> ModelSpec:
    """Refuse ``model_type`` (no native family, no generic reader yet)."""
    from vramlens.model.families import supported_model_types

    raise ConfigError(
        f"{source}: model_type {model_type!r} has no vramlens family; supported: {', '.join(supported_model_types())}"
    )
