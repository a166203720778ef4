"""Describe any architecture the installed transformers can build, from its own code.

For a ``model_type`` with no native family (and no alias), the model is built with
transformers on the meta device and its module tree is read into a
:class:`~vramlens.model.spec.ModelSpec` whose ``generic`` field holds the parameters by
layer kind and component (:mod:`vramlens.model.generic.reader`). That reading is kept in the
recipe cache (:mod:`vramlens.model.generic.store`): the next time, the spec is built from the
file without importing torch. Memory beyond the parameters (activations, caches, working
sets) comes from recipes traced from the same code (:mod:`vramlens.simulator.recipe`).

Refusals, each one line: no ``[hf]`` extra (install hint); a type the installed transformers
does not know; a config transformers cannot build; a config whose layer counts pass
:data:`MAX_CODE_LAYERS` (building costs time per layer, so a hostile ``num_hidden_layers`` would
otherwise hold the process for minutes; sizes cost nothing on the meta device).
"""

from __future__ import annotations

import copy
import dataclasses
from importlib.util import find_spec
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from vramlens._notes import note
from vramlens.errors import ConfigError, MissingExtraError
from vramlens.model.components import FfnKind, LayerSpec, MixerKind, PositionKind, PositionSpec
from vramlens.model.config_reader import MAX_SIZE, ConfigView
from vramlens.model.generic.layout import Component, GenericLayout, layout_from_json, layout_to_json
from vramlens.model.generic.store import recipe_file, require_code_reading

if TYPE_CHECKING:
    from vramlens.model.spec import ModelSpec

__all__ = ["MAX_CODE_LAYERS", "check_layer_counts", "describe_config", "text_config"]

_PURPOSE = "describing a model_type without a native vramlens family"
#: Most layers of any stack (decoder, tower) a config read from code may declare: real models
#: have at most a few hundred; building 1,024 small layers on the meta device takes seconds.
MAX_CODE_LAYERS = 1024
#: Config keys (at any nesting: text, vision, audio sub-configs) that count layers.
_LAYER_COUNT_KEYS = frozenset(
    {"num_hidden_layers", "num_layers", "n_layer", "n_layers", "depth", "encoder_layers", "decoder_layers"}
)


def text_config(data: dict[str, Any]) -> dict[str, Any]:
    """The text decoder's part of a config: ``text_config`` when nested, else the config itself."""
    nested = data.get("text_config")
    return nested if isinstance(nested, dict) else data


def _require_hf(model_type: str, source: str) -> None:
    for package in ("torch", "transformers"):
        if find_spec(package) is None:
            raise MissingExtraError(
                f"{source}: model_type {model_type!r} has no native vramlens family; describing it from "
                f"transformers' own code needs the [hf] extra: pip install 'vramlens[hf]'"
            )


def _check_known(model_type: str, source: str, data: dict[str, Any]) -> None:
    """Refuse a type the installed transformers cannot build, saying what would help."""
    import transformers

    known = getattr(transformers.models.auto.configuration_auto, "CONFIG_MAPPING_NAMES", {})
    if model_type in known:
        return

    remote = " (its config names its own code in auto_map, which vramlens never runs)" if "auto_map" in data else ""
    raise ConfigError(
        f"{source}: model_type {model_type!r} is known neither to vramlens nor to the installed transformers "
        f"{transformers.__version__}{remote}; a newer transformers may know it"
    )


def check_layer_counts(data: Any, source: str, path: str = "") -> None:
    """Refuse in one line a layer count over :data:`MAX_CODE_LAYERS` anywhere in the config
    (the config was read with bounded nesting and size, so this walk is bounded too)."""
    if isinstance(data, list):
        for index, item in enumerate(data):
            check_layer_counts(item, source, f"{path}[{index}]")
        return
    if not isinstance(data, dict):
        return
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key in _LAYER_COUNT_KEYS and isinstance(value, int) and not isinstance(value, bool):
            if value > MAX_CODE_LAYERS:
                raise ConfigError(
                    f"{source}: {where} is {value:,}; a model read from transformers' code may have at most "
                    f"{MAX_CODE_LAYERS:,} layers per stack (real models have a few hundred)"
                )
        elif isinstance(value, (dict, list)):
            check_layer_counts(value, source, where)


def _layout(data: dict[str, Any], model_type: str, source: str, dtype: str) -> GenericLayout:
    """The layout from the recipe cache, or read from the code (and stored) on a miss."""
    file = recipe_file(data, model_type, purpose=_PURPOSE)
    stored = file.read()
    if stored is not None and isinstance(stored.get("layout"), dict):
        try:
            return layout_from_json(stored["layout"])
        except (KeyError, ValueError, TypeError):
            pass
    check_layer_counts(data, source)
    require_code_reading(f"{source}: reading model_type {model_type!r} from transformers' code")
    _check_known(model_type, source, data)
    from vramlens.model.generic.reader import read_layout

    note(__name__, "reading %s (%s) from transformers' code on the meta device (once; cached)", source, model_type)
    try:
        layout = read_layout(data, model_type, dtype)
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None
    file.write({**(stored or {}), "layout": layout_to_json(layout)})
    return layout


def _mixer(kind_components: dict[Component, int]) -> MixerKind:
    if kind_components.get(Component.ATTENTION):
        return MixerKind.ATTENTION
    if kind_components.get(Component.LINEAR_ATTENTION):
        return MixerKind.LINEAR_ATTENTION
    if kind_components.get(Component.SSM):
        return MixerKind.MAMBA
    return MixerKind.NONE


def _ffn(kind_components: dict[Component, int]) -> FfnKind:
    if kind_components.get(Component.MOE_EXPERTS):
        return FfnKind.MOE
    return FfnKind.DENSE if kind_components.get(Component.MLP) else FfnKind.NONE


def _layers(layout: GenericLayout) -> tuple[LayerSpec, ...]:
    kinds = []
    for kind in layout.kinds:
        components = dict(kind.components)
        kinds.append(LayerSpec(mixer=_mixer(components), ffn=_ffn(components)))
    return tuple(kinds[k] for k in layout.layer_kinds)


def _position(view: ConfigView, notes: list[str]) -> PositionSpec:
    limit = view.opt_integer("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
    if limit is None:
        notes.append("no context limit in the config (max_position_embeddings): seq is not checked against one")
        limit = MAX_SIZE
    return PositionSpec(kind=PositionKind.NONE, max_positions=limit)


def describe_config(data: dict[str, Any], *, model_type: str, source: str) -> ModelSpec:
    """A spec of a ``model_type`` without a native family, read from transformers' code."""
    from vramlens.model.families._common import build_spec, read_dtype

    _require_hf(model_type, source)
    view = ConfigView(text_config(data), source=source)
    if view.data is not data and "dtype" not in view.data and "torch_dtype" not in view.data:
        view = ConfigView({**view.data, **{k: data[k] for k in ("dtype", "torch_dtype") if k in data}}, source=source)
    dtype = read_dtype(view)
    layout = _layout(data, model_type, source, dtype)
    view.assumptions.append(
        f"no native vramlens family for {model_type!r}: described from transformers' code "
        f"({layout.model_class} built on the meta device)"
    )
    routed = any(kind.component(Component.MOE_EXPERTS) for kind in layout.kinds)
    if routed and not (layout.num_experts and layout.experts_per_token):
        view.assumptions.append("routed experts found but the config names no top-k: active parameters = total")
    spec = build_spec(
        ConfigView(data, source=source, assumptions=view.assumptions),
        model_type,
        hidden_size=layout.hidden_size,
        num_layers=layout.num_layers,
        vocab_size=layout.vocab_size,
        attention=None,
        mlp=None,
        layers=_layers(layout),
        position=_position(view, view.assumptions),
        tie_word_embeddings=layout.tied_embeddings,
        generic=layout,
        config=MappingProxyType(copy.deepcopy(data)),
    )
    return dataclasses.replace(spec, dtype=dtype, assumptions=tuple(dict.fromkeys(spec.assumptions)))
