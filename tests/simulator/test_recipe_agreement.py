"""Recipe-based estimates against the simulator, on types without a native family (issue 19).

For each of :data:`generic_configs.AGREEMENT_TYPES` (16 model types: dense, parallel-block,
ALiBi and learned-position decoders, MoE, hybrids with convolution and linear-attention
layers), the estimate of a full fine-tune, a LoRA fine-tune and a ``generate()`` run, made in
pure Python from the traced recipe, is within 3% of ``vramlens simulate`` of the same
workload, which runs every layer of the real model.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import requires_hf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))

from generic_configs import AGREEMENT_TYPES, four_layer_config

pytestmark = [requires_hf, pytest.mark.hf, pytest.mark.slow]

_WORKLOADS: dict[str, dict[str, Any]] = {
    "full": {"precision": "bf16", "batch": 2, "seq": 256},
    "lora": {"precision": "bf16", "method": "lora", "batch": 2, "seq": 256},
    "infer": {"mode": "infer", "precision": "bf16", "batch": 2, "prompt": 256, "generate": 32},
}


@pytest.mark.parametrize("run", sorted(_WORKLOADS))
@pytest.mark.parametrize("model_type", AGREEMENT_TYPES)
def test_recipe_estimate_agrees_with_the_simulator(model_type: str, run: str) -> None:
    from vramlens.estimator import estimate
    from vramlens.model.families import parse_config
    from vramlens.simulator import simulate

    spec = parse_config(four_layer_config(model_type), source=model_type)
    assert spec.generic is not None, f"{model_type} has a native family now: pick another type"
    workload = {"model": spec, **_WORKLOADS[run]}
    estimated, simulated = estimate(workload), simulate(workload)
    assert estimated.allocated_bytes == pytest.approx(simulated.allocated_bytes, rel=0.03)
    assert estimated.peak_phase == simulated.peak_phase
    assert any("traced from transformers' code" in note for note in estimated.assumptions)
