"""Readers shared by the family parsers: dtype, positions, heads, layer windows, MoE placement."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vramlens.dtypes import canonical_dtype
from vramlens.errors import ConfigError, InputError
from vramlens.model.config_reader import MAX_LAYERS, ConfigView
from vramlens.model.quantization import QuantizationSpec, parse_quantization_config
from vramlens.model.spec import (
    AttentionSpec,
    FfnKind,
    LayerSpec,
    MlpKind,
    MlpSpec,
    ModelSpec,
    MoeSpec,
    NormSpec,
    PositionKind,
    PositionSpec,
    QKNorm,
)

__all__ = [
    "LAYER_TYPES",
    "build_spec",
    "dense_gated_mlp",
    "explicit_windows",
    "layer_specs",
    "moe_every",
    "moe_spec",
    "read_dtype",
    "read_head_dim",
    "read_kv_heads",
    "read_layers",
    "read_position",
    "read_quantization",
    "standard_attention",
    "windows_for_all",
    "windows_none",
    "windows_qwen",
]

#: ``layer_types`` values understood, and whether they are sliding-window layers.
LAYER_TYPES = {"full_attention": False, "sliding_attention": True}


def read_dtype(view: ConfigView) -> str:
    """Checkpoint dtype from ``torch_dtype`` (transformers 4) or ``dtype`` (transformers 5).

    Absent: float32, because that is what ``from_pretrained`` builds without a dtype.
    """
    key = view.present("dtype", "torch_dtype") or "torch_dtype"
    name = view.text(
        "dtype", "torch_dtype", default="float32", why="transformers builds models in float32 when no dtype is declared"
    )
    try:
        return canonical_dtype(name, field=key).name
    except InputError as exc:
        raise view.error(key, f"is not a dtype: {exc}") from None


def read_layers(view: ConfigView, *keys: str) -> int:
    """Number of decoder layers (1..10000)."""
    return view.integer(*keys, maximum=MAX_LAYERS)


def read_head_dim(
    view: ConfigView, hidden: int, heads: int, *, default: int | None = None, why: str | None = None
) -> int:
    """``head_dim`` if the config gives one, else ``default``, else ``hidden // heads`` (which must divide)."""
    explicit = view.opt_integer("head_dim")
    if explicit is not None:
        return explicit
    if default is not None:
        if why is not None:
            view.assumptions.append(f"'head_dim' not in config; using {default} ({why})")
        return default
    if hidden % heads:
        raise view.error(
            "head_dim", f"is absent and hidden_size {hidden} is not divisible by num_attention_heads {heads}"
        )
    return hidden // heads


def read_kv_heads(view: ConfigView, heads: int, *keys: str) -> int:
    """Key/value heads (default: ``heads``, i.e. multi-head attention); must divide ``heads``."""
    keys = keys or ("num_key_value_heads",)
    kv_heads = view.integer(*keys, default=heads)
    if heads % kv_heads:
        raise view.error(keys[0], f"must divide num_attention_heads ({heads}), got {kv_heads}")
    return kv_heads


def _rope_source(view: ConfigView) -> tuple[ConfigView | None, ConfigView | None]:
    """The rope-parameter objects: transformers 5 ``rope_parameters`` and 4.x ``rope_scaling``."""
    return view.sub("rope_parameters"), view.sub("rope_scaling")


def read_position(
    view: ConfigView,
    *,
    kind: PositionKind = PositionKind.ROPE,
    max_keys: tuple[str, ...] = ("max_position_embeddings",),
    max_default: int | None = None,
    rotary_keys: tuple[str, ...] = ("partial_rotary_factor",),
    rotary_default: float = 1.0,
) -> PositionSpec:
    """Positions: context limit, rotary base, partial-rotary fraction and rotary scaling."""
    if max_default is None:
        max_positions = view.integer(*max_keys)
    else:
        max_positions = view.integer(*max_keys, default=max_default, why="the transformers config default")
    if kind is not PositionKind.ROPE:
        return PositionSpec(kind=kind, max_positions=max_positions)
    params, scaling = _rope_source(view)
    theta = view.opt_number("rope_theta", "rotary_emb_base", minimum=0.0)
    if theta is None and params is not None:
        theta = params.opt_number("rope_theta", minimum=0.0)
    fraction = view.opt_number(*rotary_keys, minimum=0.0, maximum=1.0)
    if fraction is None and params is not None:
        fraction = params.opt_number("partial_rotary_factor", minimum=0.0, maximum=1.0)
    if fraction is None or fraction == 0.0:
        fraction = rotary_default
    scale_view = scaling or params
    scale_type = None
    factor = None
    if scale_view is not None:
        scale_type = scale_view.data.get("rope_type") or scale_view.data.get("type")
        factor = scale_view.opt_number("factor", minimum=0.0)
        if scale_type == "default":
            scale_type = None
        if scale_type is not None and not isinstance(scale_type, str):
            raise scale_view.error("rope_type", f"must be a string, got {scale_type!r}")
    return PositionSpec(
        kind=kind,
        max_positions=max_positions,
        rope_theta=theta,
        rotary_fraction=fraction,
        rope_scaling=scale_type,
        rope_scaling_factor=factor,
    )


def explicit_windows(view: ConfigView, layers: int, window: int | None) -> tuple[int | None, ...] | None:
    types = view.texts("layer_types")
    if types is None:
        return None
    if len(types) != layers:
        raise view.error("layer_types", f"has {len(types)} entries for {layers} layers")
    unknown = sorted({t for t in types if t not in LAYER_TYPES})
    if unknown:
        raise view.error("layer_types", f"has unsupported {', '.join(unknown)}; expected {', '.join(LAYER_TYPES)}")
    if window is None and any(LAYER_TYPES[t] for t in types):
        raise view.error("sliding_window", "must be a positive integer when layer_types has sliding_attention layers")
    return tuple(window if LAYER_TYPES[t] else None for t in types)


def windows_for_all(view: ConfigView, layers: int) -> tuple[int | None, ...]:
    """Every layer uses ``sliding_window`` when set (Mistral, Mixtral, Phi-3, StarCoder2); else all global."""
    window = view.opt_integer("sliding_window")
    explicit = explicit_windows(view, layers, window)
    return explicit if explicit is not None else (window,) * layers


def windows_qwen(view: ConfigView, layers: int) -> tuple[int | None, ...]:
    """Qwen rule: with ``use_sliding_window``, layers ``>= max_window_layers`` use ``sliding_window``."""
    use = view.flag("use_sliding_window", default=False)
    window = view.opt_integer("sliding_window") if use else None
    explicit = explicit_windows(view, layers, window)
    if explicit is not None:
        return explicit
    first = view.integer("max_window_layers", default=28, minimum=0, maximum=MAX_LAYERS)
    return tuple(window if window is not None and i >= first else None for i in range(layers))


def windows_none(view: ConfigView, layers: int) -> tuple[int | None, ...]:
    """All layers global unless ``layer_types`` says otherwise."""
    explicit = explicit_windows(view, layers, view.opt_integer("sliding_window"))
    return explicit if explicit is not None else (None,) * layers


def layer_specs(
    windows: tuple[int | None, ...], moe_rule: Callable[[int], bool] | None = None
) -> tuple[LayerSpec, ...]:
    """Combine per-layer windows with a MoE placement rule (None: all dense)."""
    return tuple(
        LayerSpec(window=w, ffn=FfnKind.MOE if moe_rule and moe_rule(i) else FfnKind.DENSE)
        for i, w in enumerate(windows)
    )


def standard_attention(
    view: ConfigView,
    hidden: int,
    *,
    qkv_bias: bool,
    out_bias: bool,
    qk_norm: QKNorm = QKNorm.NONE,
    qk_norm_spec: NormSpec | None = None,
    head_dim_default: int | None = None,
    head_dim_why: str | None = None,
    head_keys: tuple[str, ...] = ("num_attention_heads",),
    kv_keys: tuple[str, ...] = ("num_key_value_heads",),
    dropout_keys: tuple[str, ...] = ("attention_dropout",),
    dropout_default: tuple[float, str] | None = None,
    heads_default: tuple[int, int, str] | None = None,
) -> AttentionSpec:
    """Multi-head / grouped-query attention read from the usual keys.

    ``heads_default`` = (heads, kv_heads, why) for configs that may omit head
    counts (Gemma 3 multimodal text configs rely on the config-class defaults).
    """
    if heads_default is None:
        heads = view.integer(*head_keys)
        kv_heads = read_kv_heads(view, heads, *kv_keys)
    else:
        heads = view.integer(*head_keys, default=heads_default[0], why=heads_default[2])
        kv_heads = view.integer(*kv_keys, default=heads_default[1], why=heads_default[2])
        if heads % kv_heads:
            raise view.error(kv_keys[0], f"must divide num_attention_heads ({heads}), got {kv_heads}")
    return AttentionSpec(
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=read_head_dim(view, hidden, heads, default=head_dim_default, why=head_dim_why),
        qkv_bias=qkv_bias,
        out_bias=out_bias,
        qk_norm=qk_norm,
        qk_norm_spec=qk_norm_spec or NormSpec(),
        dropout=view.number(
            *dropout_keys,
            default=dropout_default[0] if dropout_default else 0.0,
            minimum=0.0,
            maximum=0.999,
            why=dropout_default[1] if dropout_default else None,
        ),
    )


def dense_gated_mlp(
    view: ConfigView, *, key: str = "intermediate_size", bias: bool = False, act_default: str = "silu"
) -> MlpSpec:
    """A gated (SwiGLU-style) MLP of width ``intermediate_size``."""
    return MlpSpec(
        kind=MlpKind.GATED,
        intermediate_size=view.integer(key),
        bias=bias,
        activation=view.text("hidden_act", "hidden_activation", default=act_default),
    )


def moe_every(view: ConfigView, layers: int) -> Callable[[int], bool]:
    """Qwen-MoE placement: MoE unless in ``mlp_only_layers``, every ``decoder_sparse_step``-th layer."""
    only_dense = set(view.integers("mlp_only_layers") or ())
    step = view.integer("decoder_sparse_step", default=1, maximum=MAX_LAYERS)
    return lambda i: i not in only_dense and (i + 1) % step == 0


def read_quantization(view: ConfigView) -> QuantizationSpec | None:
    """The checkpoint's ``quantization_config``, if any."""
    raw = view.data.get("quantization_config")
    if raw is None:
        return None
    return parse_quantization_config(raw, where=f"{view.source}: quantization_config")


def build_spec(view: ConfigView, model_type: str, **fields: Any) -> ModelSpec:
    """Assemble a :class:`ModelSpec` from family-specific ``fields`` plus what every config shares."""
    architectures = view.data.get("architectures")
    architecture = (
        architectures[0]
        if isinstance(architectures, list) and architectures and isinstance(architectures[0], str)
        else None
    )
    try:
        return ModelSpec(
            name=fields.pop("name", model_type),
            model_type=model_type,
            dtype=read_dtype(view),
            quantization=read_quantization(view),
            architecture=architecture,
            source=view.source,
            assumptions=tuple(view.assumptions),
            **fields,
        )
    except ConfigError as exc:
        raise ConfigError(f"{view.source}: {exc}") from None


def moe_spec(view: ConfigView, **fields: Any) -> MoeSpec:
    """Build a :class:`MoeSpec`, reporting inconsistencies against this config."""
    try:
        return MoeSpec(**fields)
    except ConfigError as exc:
        raise ConfigError(f"{view.source}: {exc}") from None
