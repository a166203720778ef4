"""Readers for keys whose absent and null values mean different things in transformers' config classes.

transformers 5 config classes are dataclasses: an absent key takes the field's default, while an
explicit ``null`` is kept and then resolved in ``__post_init__`` (``num_key_value_heads: null``
means ``num_attention_heads``; ``sliding_window: null`` means no window). These helpers follow the
class exactly and record every default they use in the spec's assumptions.
"""

from __future__ import annotations

from vramlens.model.config_reader import MAX_LAYERS, ConfigView

__all__ = ["floor_head_dim", "kv_heads", "layer_type_list", "nullable_integer", "read_layer_count"]


def kv_heads(view: ConfigView, heads: int, *, default: int | None, why: str) -> int:
    """``num_key_value_heads``: its value; ``null`` -> ``heads``; absent -> ``default`` (``None``: ``heads``)."""
    key = "num_key_value_heads"
    if view.present(key) is not None:
        kv = view.integer(key)
    elif key in view.data or default is None:
        kv = heads
        if key not in view.data:
            view.assumptions.append(f"'{key}' not in config; using num_attention_heads {heads} ({why})")
    else:
        kv = view.integer(key, default=default, why=why)
    if heads % kv:
        raise view.error(key, f"must divide num_attention_heads ({heads}), got {kv}")
    return kv


def nullable_integer(view: ConfigView, key: str, *, default: int | None, why: str) -> int | None:
    """An integer key whose ``null`` means "none" and whose absence means the class default."""
    if key in view.data:
        return view.opt_integer(key)
    if default is not None:
        view.assumptions.append(f"'{key}' not in config; using {default!r} ({why})")
    return default


def layer_type_list(view: ConfigView, layers: int, allowed: tuple[str, ...]) -> tuple[str, ...] | None:
    """``layer_types`` checked against ``layers`` and ``allowed``, or None when absent or null."""
    types = view.texts("layer_types")
    if types is None:
        return None
    if len(types) != layers:
        raise view.error("layer_types", f"has {len(types)} entries for {layers} layers")
    unknown = sorted({t for t in types if t not in allowed})
    if unknown:
        raise view.error("layer_types", f"has unsupported {', '.join(unknown)}; expected {', '.join(allowed)}")
    return types


def read_layer_count(view: ConfigView, *, default: int, why: str) -> int:
    """``num_hidden_layers`` (1..10000) with the class default."""
    return view.integer("num_hidden_layers", default=default, maximum=MAX_LAYERS, why=why)


def floor_head_dim(view: ConfigView, hidden: int, heads: int, *, code: str) -> int:
    """``head_dim`` if given, else ``hidden_size // num_attention_heads`` rounded down, as ``code``
    (``getattr(config, "head_dim", hidden // heads)``) computes it; recorded when it does not divide."""
    if view.present("head_dim") is not None:
        return view.integer("head_dim")
    if hidden < heads:
        raise view.error("head_dim", f"is absent and hidden_size {hidden} < num_attention_heads {heads}")
    if hidden % heads:
        view.assumptions.append(
            f"'head_dim' not in config; using hidden_size // num_attention_heads = {hidden // heads} (as {code})"
        )
    return hidden // heads
