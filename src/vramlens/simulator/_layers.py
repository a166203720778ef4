"""Which decoder layers a replayed simulation runs: layer kinds, the repeated region, the cut.

A training step of a model whose decoder layers repeat is simulated by running a model cut
down to a few layers and replaying the recorded events of one of them for the layers left
out (:mod:`vramlens.simulator._replay`). This module decides the cut on the full model, still
on the meta device: every layer gets a *kind* (two layers are of one kind when they are built
alike: the same module classes, parameter and buffer shapes, dtypes and attributes, the
same entries in the config's per-layer lists and the same checkpointing flag), and the
longest region whose kinds repeat with a short period ``p`` is cut to three units of ``p``
layers: ``U0`` (the region's first unit), ``U1`` (the template) and ``U2`` (the region's last
unit). The layers between ``U1`` and ``U2`` are the replayed copies.

Anything that makes layers unlike in ways the module tree does not show stops the plan
(no region, so the step runs in full): a module shared between layers, a layer listed twice,
a LoRA target or quantization skip entry naming a layer by index.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vramlens._extras import require

__all__ = ["LayerCut", "cutter", "plan_region"]

#: Attributes that hold a layer's position; they differ between layers of one kind and are left out of the kind.
_INDEX_ATTRIBUTES = frozenset({"layer_idx", "layer_id", "layer_index", "layer_number"})
#: Module attributes that are the tree itself (compared through the children and tensors).
_TREE_ATTRIBUTES = frozenset({"_parameters", "_buffers", "_modules", "training"})
#: Longest repeating unit looked for (Gemma 3: five sliding layers and a global one).
MAX_PERIOD = 12
#: Types whose values are their own key in :func:`_value_key`.
_PLAIN_TYPES = frozenset({type(None), bool, int, float, str})
#: Key of an empty container of each type, as :func:`_value_key`'s general rules make it.
_EMPTY_KEYS: dict[type, tuple[str, tuple[()]]] = {
    dict: ("map", ()),
    OrderedDict: ("map", ()),
    list: ("seq", ()),
    tuple: ("seq", ()),
    set: ("set", ()),
    frozenset: ("set", ()),
}
#: Names of multimodal towers, whose layer lists are not the decoder's.
_TOWERS = ("vision", "visual", "audio")


@dataclass(frozen=True, kw_only=True)
class Region:
    """A run of layers ``[start, stop)`` whose kinds repeat every ``period`` layers."""

    start: int
    period: int
    stop: int

    @property
    def copies(self) -> int:
        """Units replayed between the template ``U1`` and the last unit ``U2``."""
        return (self.stop - self.start) // self.period - 3

    def later(self, units: int) -> Region | None:
        """The region starting ``units`` units later (None when fewer than four units are left)."""
        start = self.start + units * self.period
        return Region(start=start, period=self.period, stop=self.stop) if self.stop - start >= 4 * self.period else None

    def kept(self, total: int) -> list[int]:
        """Original indexes of the layers the cut model keeps, in order."""
        p, s = self.period, self.start
        return [*range(0, s + 2 * p), *range(self.stop - p, total)]


@dataclass(kw_only=True)
class LayerCut:
    """What :func:`cutter` decided and found while the model was built (filled on the meta model)."""

    region: Region | None = None
    total: int = 0
    kept_layers: list[Any] = field(default_factory=list)
    """The kept layer modules, in order (the cut list)."""
    layer_list: Any = None
    checkpointed: dict[int, bool] = field(default_factory=dict)
    """id(layer) -> whether the full model checkpoints it (``recompute_every`` > 1)."""
    frozen_input: bool = False
    """The embedding output needs no gradient (LoRA, QLoRA): layer 0's backward differs from the
    others', so a region that starts at layer 0 starts one unit later."""
    skip_units: int = 0
    """Units more to leave out at the region's start (a retry after the units allocated unlike)."""

    def original_index(self, position: int) -> int:
        """The full model's index of the cut list's layer ``position``."""
        assert self.region is not None
        return self.region.kept(self.total)[position]

    def unit_of(self, index: int) -> int:
        """Unit of a full-model layer index: 0, 1, 2 (U0, U1, U2), -2 another layer."""
        assert self.region is not None
        r = self.region
        if r.start <= index < r.start + 2 * r.period:
            return (index - r.start) // r.period
        if r.stop - r.period <= index < r.stop:
            return 2
        return -2


def cutter(workload: Any, layers_path: str | None, every: int, cut: LayerCut) -> Callable[[Any], None]:
    """A ``prepare`` hook for :func:`~vramlens.simulator.build.build_model` that plans the region on
    the full meta model and, when there is one, keeps only the layers of :meth:`Region.kept`."""

    def prepare(model: Any) -> None:
        torch = require("torch", purpose="vramlens simulate")
        found = _layer_list(model, layers_path)
        if found is None or _named_by_index(workload):
            return
        parent, name, layers = found
        checkpointed = _checkpoint_flags(model, every)
        region = plan_region(_kinds(model, list(layers), checkpointed))
        if region is not None:
            region = region.later(cut.skip_units + (1 if cut.frozen_input and region.start == 0 else 0))
        if region is None:
            return
        cut.region, cut.total, cut.checkpointed = region, len(layers), checkpointed
        cut.kept_layers = [layers[i] for i in region.kept(len(layers))]
        cut.layer_list = torch.nn.ModuleList(cut.kept_layers)
        setattr(parent, name, cut.layer_list)

    return prepare


def plan_region(kinds: list[int] | None) -> Region | None:
    """The region with the most replayed layers (ties: the shorter period), or None when no
    region has a unit to replay (fewer than four units)."""
    if kinds is None:
        return None
    best: Region | None = None
    total = len(kinds)
    for period in range(1, min(MAX_PERIOD, total // 4) + 1):
        index = 0
        while index + period < total:
            end = index
            while end + period < total and kinds[end] == kinds[end + period]:
                end += 1
            units = (end + period - index) // period
            region = Region(start=index, period=period, stop=index + units * period)
            if units >= 4 and (best is None or region.copies * period > best.copies * best.period):
                best = region
            index = max(end, index + 1)
    return best


def _layer_list(model: Any, layers_path: str | None) -> tuple[Any, str, Any] | None:
    """(parent module, attribute, list) of the decoder layers: the spec's path for a model
    described from its code, else the one ``ModuleList`` of the most modules outside the towers."""
    torch = require("torch", purpose="vramlens simulate")
    if layers_path is not None:
        parent_path, _, name = layers_path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        return parent, name, getattr(parent, name)
    lists = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and not any(tower in name for tower in _TOWERS)
    ]
    if not lists:
        return None
    longest = max(len(module) for _, module in lists)
    chosen = [(name, module) for name, module in lists if len(module) == longest]
    if len(chosen) != 1:
        return None
    path, layers = chosen[0]
    parent_path, _, name = path.rpartition(".")
    return (model.get_submodule(parent_path) if parent_path else model), name, layers


def _named_by_index(workload: Any) -> bool:
    """Whether a LoRA target names modules by a dotted path (which may name a layer by index)."""
    if workload.method.value not in ("lora", "qlora"):
        return False
    names = [*workload.lora.targets, *workload.lora.modules_to_save]
    return any("." in name or any(ch.isdigit() for ch in name) for name in names if name != "all-linear")


def _checkpoint_flags(model: Any, every: int) -> dict[int, bool]:
    """id(layer) -> checkpointed, for the layers the simulator's ``recompute_every`` picks."""
    if every <= 1:
        return {}
    from vramlens.simulator.train import checkpoint_candidates

    return {id(layer): index % every == 0 for index, layer in enumerate(checkpoint_candidates(model))}


def _kinds(model: Any, layers: list[Any], checkpointed: dict[int, bool]) -> list[int] | None:
    """Each layer's kind (equal numbers: built alike), or None when layers share modules."""
    if len({id(layer) for layer in layers}) != len(layers):
        return None
    owners: dict[int, int] = {}
    for index, layer in enumerate(layers):
        for module in layer.modules():
            if owners.setdefault(id(module), index) != index:
                return None
    per_layer = _per_layer_config(model, len(layers))
    keys: dict[Any, int] = {}
    kinds = []
    for index, layer in enumerate(layers):
        key = (_signature(layer), tuple(v[index] for v in per_layer), checkpointed.get(id(layer)))
        kinds.append(keys.setdefault(key, len(keys)))
    return kinds


def _per_layer_config(model: Any, total: int) -> list[Any]:
    """The config's lists with one entry per layer (``layer_types``, ``no_rope_layers``, ...)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return [value for value in vars(config).values() if isinstance(value, list | tuple) and len(value) == total]


def _signature(layer: Any) -> tuple[Any, ...]:
    """What makes a layer behave as it does: per module, its class, attributes and tensors."""
    parts = []
    for name, module in layer.named_modules():
        attributes = tuple(
            (key, _value_key(value))
            for key, value in sorted(vars(module).items())
            if key not in _TREE_ATTRIBUTES and key not in _INDEX_ATTRIBUTES
        )
        tensors = tuple(
            (key, tuple(t.shape), str(t.dtype), bool(t.requires_grad))
            for key, t in (*module._parameters.items(), *module._buffers.items())
            if t is not None
        )
        parts.append((name, type(module).__module__, type(module).__qualname__, attributes, tensors))
    return tuple(parts)


def _value_key(value: Any) -> Any:
    """A comparable stand-in for an attribute value: plain values as they are, containers by
    their items, functions by name, tensors by shape and dtype, other objects by identity.
    Exact plain types and empty containers (most of a module's attributes: numbers and its
    empty hook tables) are answered first, with the value the general rules below give them."""
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return value
    empty = _EMPTY_KEYS.get(kind)
    if empty is not None and not value:
        return empty
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return ("seq", tuple(_value_key(item) for item in value))
    if isinstance(value, set | frozenset):
        return ("set", tuple(sorted(repr(_value_key(item)) for item in value)))
    if isinstance(value, dict):  # hook tables are keyed by handle ids: compare their hooks
        return ("map", tuple((key if isinstance(key, str) else None, _value_key(item)) for key, item in value.items()))
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return ("tensor", tuple(value.shape), str(value.dtype))
    if isinstance(value, functools.partial):  # a partial per layer (GELU's tanh approximation)
        return ("partial", _value_key(value.func), _value_key(value.args), _value_key(value.keywords))
    if callable(value) and hasattr(value, "__qualname__"):
        return ("call", getattr(value, "__module__", ""), value.__qualname__)
    return ("object", type(value).__qualname__, id(value))
