"""Readers shared by the hybrid families (Mamba / linear attention beside attention): the config
class's defaults, per-layer block types (with transformers' legacy names) and the Mamba 2 mixer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramlens.errors import ConfigError
from vramlens.model.config_reader import MAX_LAYERS, ConfigView
from vramlens.model.spec import FfnKind, LayerSpec, MixerKind
from vramlens.model.ssm import MambaSpec, MambaVersion

__all__ = ["ClassDefaults", "block_types", "kv_heads", "layers_from_types", "mamba2_spec", "mamba_head_dim"]

#: transformers' ``_LEGACY_LAYER_TYPE_REMAP`` (configuration_utils.py), applied to every config's ``layer_types``.
_LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}


class ClassDefaults:
    """Reads keys with the defaults of one transformers config class, each default used recorded
    in the spec's assumptions (naming the class)."""

    def __init__(self, view: ConfigView, cls: str) -> None:
        self.view = view
        self.why = f"{cls} default"

    def integer(self, *keys: str, default: int, minimum: int = 1, maximum: int | None = None) -> int:
        if maximum is None:
            return self.view.integer(*keys, default=default, minimum=minimum, why=self.why)
        return self.view.integer(*keys, default=default, minimum=minimum, maximum=maximum, why=self.why)

    def flag(self, key: str, default: bool) -> bool:
        return self.view.flag(key, default=default, why=self.why)

    def text(self, *keys: str, default: str) -> str:
        return self.view.text(*keys, default=default, why=self.why)

    def number(self, key: str, default: float) -> float:
        return self.view.number(key, default=default, minimum=0.0, maximum=0.999, why=self.why)


def kv_heads(view: ConfigView, d: ClassDefaults, heads: int, *, default: int | None) -> int:
    """``num_key_value_heads``: the class default when absent, ``heads`` when null (or the default is
    None), as these config classes' ``__post_init__`` set it; it must divide ``heads``."""
    key = "num_key_value_heads"
    if default is None or (key in view.data and view.data[key] is None):
        value = view.integer(key, default=heads, why=f"{d.why}: as many as the attention heads")
    else:
        value = d.integer(key, default=default)
    if heads % value:
        raise view.error(key, f"must divide num_attention_heads ({heads}), got {value}")
    return value


def block_types(view: ConfigView, key: str, *, layers: int | None, allowed: Mapping[str, Any]) -> tuple[str, ...]:
    """``key`` (a list of block type names) with transformers' legacy names mapped, every entry one
    of ``allowed``, one per layer when ``layers`` is given."""
    raw = view.texts(key)
    if raw is None:
        raise view.error(key, "is missing")
    types = tuple(_LEGACY.get(t, t) for t in raw)
    if layers is not None and len(types) != layers:
        raise view.error(key, f"has {len(types)} entries for {layers} layers")
    if not types or len(types) > MAX_LAYERS:
        raise view.error(key, f"must list between 1 and {MAX_LAYERS} layers, got {len(types)}")
    unknown = sorted(set(types) - set(allowed))
    if unknown:
        raise view.error(key, f"has unsupported {', '.join(unknown)}; expected {', '.join(allowed)}")
    return types


def layers_from_types(
    types: tuple[str, ...], mixers: Mapping[str, MixerKind], ffn_of: Mapping[int, FfnKind] | FfnKind
) -> tuple[LayerSpec, ...]:
    """One :class:`LayerSpec` per block type: its mixer from ``mixers``, its FFN from ``ffn_of``
    (one kind for all layers, or one per layer index)."""
    return tuple(
        LayerSpec(mixer=mixers[t], ffn=ffn_of if isinstance(ffn_of, FfnKind) else ffn_of[i])
        for i, t in enumerate(types)
    )


def mamba2_spec(view: ConfigView, **fields: Any) -> MambaSpec:
    """A Mamba 2 :class:`MambaSpec`, its consistency errors naming this config."""
    try:
        return MambaSpec(version=MambaVersion.MAMBA2, **fields)
    except ConfigError as exc:
        raise ConfigError(f"{view.source}: {exc}") from None


def mamba_head_dim(view: ConfigView, key: str, *, inner: int, heads: int, why: str) -> int:
    """A Mamba 2 head width: the config's ``key``, or ``"auto"`` / absent: ``inner / heads``
    (which must divide), as the Falcon-H1 and Granite 4.0-H config classes compute it."""
    raw = view.data.get(key, "auto")
    if raw == "auto" or raw is None:
        if inner % heads:
            raise view.error(key, f"is auto and the {heads} Mamba heads do not divide the inner width {inner}")
        if key not in view.data:
            view.assumptions.append(f"'{key}' not in config; using auto = {inner} / {heads} ({why})")
        return inner // heads
    head = view.integer(key)
    if head * heads != inner:
        raise view.error(key, f"{head} x {heads} Mamba heads must equal the Mamba inner width {inner}")
    return head
