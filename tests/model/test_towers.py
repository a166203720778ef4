"""Vision towers and projectors against transformers' own modules (the [hf] extra).

For every multimodal family config, and for the default config of each multimodal type,
the model is built on the meta device; the parameters under the tower's and the
projector's module paths must equal vramlens' ``vision_tower`` and ``projector`` counts,
and every ``nn.Linear`` there must be one of the spec's :class:`TowerLinear` modules
(same shape and bias), each counted as often as it occurs: that list is what LoRA
targets and bitsandbytes quantizes.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from typing import Any

import pytest

from conftest import HAVE_TRANSFORMERS
from family_configs import MULTIMODAL_CONFIGS
from vramlens.model.components import PROJECTOR, VISION_TOWER
from vramlens.model.families import parse_config

pytestmark = [
    pytest.mark.hf,
    pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="needs the [hf] extra (transformers + torch)"),
]

#: Module-path prefixes of the projector and of the whole vision side, per model_type.
_PATHS = {
    "llama4": (("multi_modal_projector.",), "vision_model."),
    "qwen2_5_vl": (("model.visual.merger.",), "model.visual."),
    "qwen3_vl": (("model.visual.merger.", "model.visual.deepstack_merger_list."), "model.visual."),
    "qwen3_vl_moe": (("model.visual.merger.", "model.visual.deepstack_merger_list."), "model.visual."),
    "mistral3": (("model.multi_modal_projector.",), "model.vision_tower."),
    "gemma3": (("model.multi_modal_projector.",), "model.vision_tower."),
}
_DEFAULT_TYPES = ("llama4", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "mistral3")


def _build(config: dict[str, Any]) -> Any:
    import torch
    import transformers

    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        hf_config = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
        return transformers.AutoModelForImageTextToText.from_config(hf_config)


def _part(name: str, model_type: str) -> str | None:
    projector, vision = _PATHS[model_type]
    if name.startswith(projector):
        return PROJECTOR
    if name.startswith(vision):
        return VISION_TOWER
    return None


def _check(config: dict[str, Any]) -> None:
    import torch

    spec = parse_config(config)
    assert spec.vision is not None
    model = _build(config)
    counts: Counter[str] = Counter()
    for name, parameter in model.named_parameters():
        part = _part(name, spec.model_type)
        if part is not None:
            counts[part] += parameter.numel()
    assert counts[VISION_TOWER] == spec.vision.tower_parameters
    assert counts[PROJECTOR] == spec.vision.projector_parameters
    found: Counter[tuple[str, int, int, bool, str]] = Counter()
    for name, module in model.named_modules():
        part = _part(name + ".", spec.model_type)
        if part is None or not isinstance(module, torch.nn.Linear):
            continue
        matches = [s for s in spec.vision.linears if ("." + name).endswith("." + s.name) and s.part == part]
        assert matches, f"{name} is not among the spec's vision linears"
        best = max(matches, key=lambda s: len(s.name))
        assert (best.in_features, best.out_features, best.bias) == (
            module.in_features,
            module.out_features,
            module.bias is not None,
        ), name
        found[(best.name, best.in_features, best.out_features, best.bias, best.part)] += 1
    expected = Counter({(s.name, s.in_features, s.out_features, s.bias, s.part): s.count for s in spec.vision.linears})
    assert found == expected


@pytest.mark.parametrize("key", [k for k, c in MULTIMODAL_CONFIGS.items() if "vision_config" in c])
def test_family_config_towers_match_transformers(key: str) -> None:
    _check(MULTIMODAL_CONFIGS[key])


@pytest.mark.slow
@pytest.mark.parametrize("model_type", _DEFAULT_TYPES)
def test_default_config_matches_transformers(model_type: str) -> None:
    """The config transformers builds by default for the type (what the census reads): the
    whole count to the parameter, and the tower and projector by module path."""
    import transformers

    config = json.loads(transformers.AutoConfig.for_model(model_type).to_json_string(use_diff=False))
    spec = parse_config(config)
    model = _build(config)
    assert spec.num_parameters == sum(p.numel() for p in model.parameters())
    _check(config)


def test_gemma3_tower_matches_transformers() -> None:
    from family_configs import FAMILY_CONFIGS

    _check(FAMILY_CONFIGS["gemma3"])
