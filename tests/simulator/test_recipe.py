"""Recipes traced from the real code (issue 19): the hand-written families equal their traced
recipe, so formulas cannot drift from the code people run; recipes are exact where they were
fitted and say when they do not interpolate.

The recipe of a native family is traced by reading its config with the generic reader (as a
type without a family would be) and measuring what one layer allocates; the per-layer bytes
per token it keeps for backward must equal ``layer_saved_parts``, within the tolerances
``tests/estimator/test_activations_hf.py`` documents for CPU-vs-CUDA differences.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import requires_hf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "estimator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))

from test_activations_hf import _CONFIGS, _EAGER_ONLY, _tolerance, estimated_per_token

pytestmark = [requires_hf, pytest.mark.hf]

_SEQ, _BATCH = 64, 2


def traced_per_token(config: dict[str, Any], *, precision: str, attention: str, layer: int = 1) -> float:
    """The traced recipe's bytes per token that layer ``layer`` keeps at the loss (full fine-tuning)."""
    from vramlens.estimator.generic import training_recipe
    from vramlens.model.generic import describe_config
    from vramlens.resolve.context import resolve_training
    from vramlens.workload.load import load_workload

    spec = describe_config(dict(config), model_type=config["model_type"], source="family")
    workload = load_workload(
        {"model": spec, "precision": precision, "batch": _BATCH, "seq": _SEQ, "attention": attention}
    )
    recipe = training_recipe(resolve_training(spec, workload), recompute=False)
    assert spec.generic is not None
    fit = recipe.kinds[spec.generic.layer_kinds[layer]].end_of_forward
    per_sequence = fit.at(_BATCH, _SEQ) - fit.at(0, _SEQ)
    return per_sequence / (_BATCH * _SEQ)


def _cases() -> list[tuple[str, str, str]]:
    """Every family in bf16 with its usual kernel (SDPA, or eager where transformers refuses SDPA
    or the CPU would fall back to the math kernel), the s x s eager path of a few in fp32, and the
    training KV cache of two multimodal wrappers under autocast."""
    cases = [
        (family, "bf16", "eager" if family in _EAGER_ONLY else "sdpa") for family in _CONFIGS if family != "gemma3"
    ]
    cases += [(family, "fp32", "eager") for family in ("llama", "gemma", "gpt_neox", "falcon-sequential", "phi")]
    # The training KV cache of the multimodal wrappers: fp32 under autocast, beside repeated eager keys.
    cases += [("qwen2_5_vl-flat-tied-sliding", "mixed-bf16", "sdpa"), ("qwen3_vl", "mixed-bf16", "eager")]
    return cases


@pytest.mark.slow
@pytest.mark.parametrize(("family", "precision", "attention"), _cases())
def test_every_hand_written_family_equals_its_traced_recipe(family: str, precision: str, attention: str) -> None:
    """What a layer keeps alive at the loss: autograd's saved tensors and, for the multimodal
    wrappers whose text model fills a KV cache in training (Qwen2.5-VL's flat sliding config: the
    cache keeps the concatenated keys and values the masked kernel repeated), the cache."""
    config = _CONFIGS[family]
    ours = estimated_per_token(config, precision=precision, attention=attention, training_cache=True)
    traced = traced_per_token(config, precision=precision, attention=attention)
    assert ours == pytest.approx(traced, rel=_tolerance(family, precision), abs=0.5)


def test_llama_equals_its_traced_recipe() -> None:
    """The most used family, kept in the fast suite."""
    config = _CONFIGS["llama"]
    assert estimated_per_token(config, precision="bf16", attention="sdpa") == traced_per_token(
        config, precision="bf16", attention="sdpa"
    )
