"""Per-layer-kind dispatch: every estimator term counts a layer by its (mixer, FFN) kind through a
registry, and a kind without an entry is refused in one line, never counted as attention."""

from __future__ import annotations

import dataclasses

import pytest

from vramlens.errors import ConfigError, InputError
from vramlens.estimator import estimate_resolved
from vramlens.estimator.activations import _MIXER_SAVED
from vramlens.model import modules, params
from vramlens.model.resolve import load_model
from vramlens.model.spec import FfnKind, LayerSpec, MixerKind, ModelSpec
from vramlens.workload.load import load_workload


def _with_layers(spec: ModelSpec, layers: tuple[LayerSpec, ...]) -> ModelSpec:
    return dataclasses.replace(spec, layers=layers)


def _workload(**extra: object) -> object:
    return load_workload({"model": "llama-3.2-1b", "batch": 1, "seq": 512, **extra})


def test_a_layer_without_ffn_or_mixer_counts_only_its_half() -> None:
    # Nemotron-H style blocks: a mixer-only layer and an FFN-only layer hold, between them, the
    # parameters of one full layer (one norm each instead of two: norms_per_layer stays 2 here).
    spec = load_model("llama-3.2-1b")
    halves = (LayerSpec(ffn=FfnKind.NONE), LayerSpec(mixer=MixerKind.NONE)) * (spec.num_layers // 2)
    split = _with_layers(spec, halves)
    full, halved = spec.parameter_breakdown, split.parameter_breakdown
    assert halved.attention == full.attention // 2
    assert halved.mlp == full.mlp // 2
    assert halved.norms == full.norms
    lengths = {kind: len(modules.layer_linears(split, kind)) for kind in modules.layer_kinds(split)}
    assert sorted(lengths.values()) == [3, 4]  # gate/up/down; q/k/v/o


def test_saved_activations_of_the_halves_add_up_to_a_full_layer() -> None:
    from vramlens.estimator.activations import layer_saved_parts
    from vramlens.estimator.layout import lora_targets
    from vramlens.estimator.recompute import layer_recipe, train_state
    from vramlens.model.spec import LayerKind
    from vramlens.resolve.context import resolve_training

    spec = load_model("llama-3.2-1b")
    ctx = resolve_training(spec, _workload())  # type: ignore[arg-type]
    recipe = layer_recipe(ctx, train_state(ctx, lora_targets(ctx)), [])

    def total(kind: LayerKind) -> float:
        return sum(part.bytes_per_token for part in layer_saved_parts(recipe, kind))

    both = total(LayerKind())
    assert total(LayerKind(ffn=FfnKind.NONE)) + total(LayerKind(mixer=MixerKind.NONE)) == both
    assert total(LayerKind(ffn=FfnKind.NONE)) < both


def test_a_mixer_without_an_entry_is_refused_not_counted_as_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dataclasses.replace(load_model("llama-3.2-1b"))  # a fresh copy: nothing derived and cached yet
    monkeypatch.delitem(params._MIXER_PARAMETERS, MixerKind.ATTENTION)
    with pytest.raises(ConfigError, match="attention token mixer are not modelled") as info:
        params.parameter_breakdown(spec)
    assert "\n" not in str(info.value)
    monkeypatch.delitem(modules._MIXER_LINEARS, MixerKind.ATTENTION)
    with pytest.raises(ConfigError, match="not modelled"):
        modules.layer_linears(spec, spec.layers[0].kind)


def test_the_estimator_refuses_a_mixer_whose_activations_are_not_modelled(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dataclasses.replace(load_model("llama-3.2-1b"))
    monkeypatch.delitem(_MIXER_SAVED, MixerKind.ATTENTION)
    with pytest.raises(InputError, match="attention layers, whose saved activations vramlens does not model") as info:
        estimate_resolved(spec, _workload(), None)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
