"""Parameter counts equal transformers' own, to the parameter (the [hf] extra).

Every catalog entry and every synthetic family config is built by transformers
on the meta device (no memory, no weights) and its ``parameters()`` summed;
vramlens' pure-Python count must match exactly. This is the independent check
of every counting rule in model/params.py and every parser in model/families.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from conftest import HAVE_TRANSFORMERS
from family_configs import FAMILY_CONFIGS, HYBRID_CONFIGS, HYBRID_VARIANTS, LEGACY_FALCON, native_falcon
from vramlens.model.catalog import catalog_entries
from vramlens.model.families import parse_config

pytestmark = [
    pytest.mark.hf,
    pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="needs the [hf] extra (transformers + torch)"),
]


def transformers_parameter_count(config: dict[str, Any]) -> int:
    """Build ``config`` with transformers on the meta device and count ``model.parameters()``."""
    import torch
    import transformers

    if config["model_type"] in ("RefinedWeb", "RefinedWebModel"):
        config = native_falcon(config)
    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "auto_map")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_config = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
        model_classes = (transformers.AutoModelForCausalLM, transformers.AutoModelForImageTextToText)
        if config["model_type"] in transformers.models.auto.modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
            # The whole multimodal model (llama4 maps to a text-only class for causal LM).
            model_classes = model_classes[::-1]
        with torch.device("meta"):
            for index, auto in enumerate(model_classes):
                try:
                    model = auto.from_config(hf_config)
                    break
                except ValueError:
                    if index == len(model_classes) - 1:
                        raise
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("entry", catalog_entries(), ids=lambda e: e.name)
def test_catalog_entry_matches_transformers(entry: Any) -> None:
    assert entry.spec().num_parameters == transformers_parameter_count(entry.config)


@pytest.mark.parametrize("key", sorted(FAMILY_CONFIGS))
def test_family_config_matches_transformers(key: str) -> None:
    config = FAMILY_CONFIGS[key]
    assert parse_config(config).num_parameters == transformers_parameter_count(config)


def test_legacy_falcon_matches_transformers() -> None:
    assert parse_config(LEGACY_FALCON).num_parameters == transformers_parameter_count(LEGACY_FALCON)


@pytest.mark.parametrize("key", sorted(HYBRID_VARIANTS))
def test_hybrid_variant_matches_transformers(key: str) -> None:
    """Biases, null widths, block lists, no experts and each hybrid family's default config
    (every structural key from the config class's defaults)."""
    config = HYBRID_VARIANTS[key]
    assert parse_config(config).num_parameters == transformers_parameter_count(config)


def _slot(child: str, path: str, moe_layer: bool) -> str:
    """The ParameterBreakdown slot of a decoder-layer parameter, from the class of the layer's child module."""
    if child.endswith("RMSNorm"):
        return "norms"
    if "GatedDeltaNet" in child:
        return "linear_attention"
    if "Mamba" in child or child.endswith("Mixer"):
        return "ssm"
    if "Attention" in child:
        return "attention"
    if "Moe" in child or "MoE" in child:
        if path.startswith("experts."):
            return "moe_experts"
        return "moe_router" if path.startswith(("router.", "gate.")) else "moe_shared"
    assert "MLP" in child, child
    return "moe_shared" if moe_layer else "mlp"


def transformers_layer_slots(config: dict[str, Any]) -> dict[str, int]:
    """Decoder-layer parameters of transformers' model by breakdown slot."""
    import torch
    import transformers

    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_config = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(hf_config)
    slots: dict[str, int] = {}
    for layer in model.model.layers:
        moe_layer = any(_slot(type(m).__name__, "experts.", False) == "moe_experts" for m in layer.children())
        for child in layer.children():
            for path, param in child.named_parameters():
                slot = _slot(type(child).__name__, path, moe_layer)
                slots[slot] = slots.get(slot, 0) + param.numel()
    return slots


@pytest.mark.parametrize("key", sorted(HYBRID_CONFIGS))
def test_hybrid_components_match_transformers(key: str) -> None:
    """Per component: Mamba mixers (``ssm``), gated DeltaNet (``linear_attention``), attention, MLP,
    routed experts, shared experts and routers, layer norms, each equal to transformers' modules."""
    breakdown = parse_config(HYBRID_CONFIGS[key]).parameter_breakdown.as_dict()
    theirs = transformers_layer_slots(HYBRID_CONFIGS[key])
    assert {slot: breakdown[slot] for slot in theirs} == theirs
    assert (
        sum(theirs.values())
        == breakdown["total"] - breakdown["embedding"] - breakdown["lm_head"] - breakdown["final_norm"]
    )
