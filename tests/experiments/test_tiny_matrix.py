"""Acceptance (issue 10): a tiny matrix trained for real on CPU, measured, and predicted.

A llama-style model of 4.2M parameters (hidden 256, 4 layers, intermediate 688, vocabulary
2048, untied) trains 3 AdamW steps (torch's CPU default: the per-tensor loop) on 4 x 256
random tokens in five configurations: fp32 (the control), bf16, checkpoint, fused-optimizer
and checkpoint+fused-optimizer. The tracker measures the last step's allocated peak.

What must hold, and why:

* bf16 halves the weights (the parameters at the peak: 2 bytes instead of 4 per element) and
  lowers the peak; checkpointing lowers the activations at the peak and the peak.
* The optimizer step in backward alone leaves the peak unchanged here, as in seed 004
  (p005 "Optimizer Fusion": 21.164 GiB against the control's 21.165): without checkpointing
  the step peaks at the start of backward, beside every activation, before any gradient
  exists, so freeing gradients early cannot lower it. With checkpointing the peak moves to
  the end of backward, where the gradients are, and fusion then lowers it (seed: 12.529 ->
  7.425 GiB).
* The optimizer in backward is exact: per-tensor AdamW stepped per parameter makes the same
  updates as one AdamW over all, so the losses of every fp32 run agree to the bit.
* The estimator is within 5% of every measurement (the cuBLAS workspace it counts for CUDA
  is left out on CPU) and the simulator within 1% (it runs the same code on fake tensors).
  Found on the way: at the last layer of backward, where a checkpointed step peaks, the
  estimator left out the kept model outputs (the logits) and counted the input embedding's
  gradient, which autograd makes only after that layer; it was 5.3% low for ``checkpoint``
  (now within 0.1%).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from conftest import requires_hf, tiny_llama_config
from vramlens.experiments import ResultStore, matrix_from_list, run_matrix

pytestmark = [requires_hf, pytest.mark.hf, pytest.mark.slow]

CONFIG = tiny_llama_config(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=4, vocab_size=2048, max_position_embeddings=1024, hidden_act="silu",
                           torch_dtype="float32")  # fmt: skip
TECHNIQUES = "bf16,checkpoint,fused-optimizer,checkpoint+fused-optimizer"


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    matrix = matrix_from_list(CONFIG, TECHNIQUES, steps=3, batch=4, seq=256, device="cpu")
    store = ResultStore(Path(tmp_path_factory.mktemp("store")) / "runs.jsonl")
    result = run_matrix(matrix, store)
    assert result.device == "cpu" and result.reused == 0
    assert [row["key"] for row in store.rows()] == [run.key for run in matrix.runs]
    return {row["name"]: row for row in result.rows}


def test_the_model_has_a_few_million_parameters(rows: dict[str, dict[str, Any]]) -> None:
    params = rows["control"]["measured_breakdown"]["parameters"] // 4  # fp32
    assert 4_000_000 < params < 4_500_000


def test_measured_ordering(rows: dict[str, dict[str, Any]]) -> None:
    control, bf16, checkpoint = rows["control"], rows["bf16"], rows["checkpoint"]
    fused, both = rows["fused-optimizer"], rows["checkpoint+fused-optimizer"]
    parts = {name: row["measured_breakdown"] for name, row in rows.items()}
    assert parts["bf16"]["parameters"] * 2 == parts["control"]["parameters"]
    assert parts["checkpoint"]["activations"] < parts["control"]["activations"]
    assert bf16["measured_peak_bytes"] < control["measured_peak_bytes"]
    assert checkpoint["measured_peak_bytes"] < control["measured_peak_bytes"]
    assert fused["measured_peak_bytes"] == pytest.approx(control["measured_peak_bytes"], rel=0.01)
    assert both["measured_peak_bytes"] < checkpoint["measured_peak_bytes"]


def test_runs_train_and_fusion_is_exact(rows: dict[str, dict[str, Any]]) -> None:
    for row in rows.values():
        assert row["measured_by"] == "tracker" and row["tokens_per_s"] > 0
        assert len(row["losses"]) == 3 and all(math.isfinite(loss) for loss in row["losses"])
    assert rows["control"]["losses"][0] == pytest.approx(math.log(2048), rel=0.05)  # random init: ~ln V
    fp32 = [name for name in rows if name != "bf16"]
    assert len({tuple(rows[name]["losses"]) for name in fp32}) == 1


@pytest.mark.parametrize("name", ["control", "bf16", "checkpoint", "fused-optimizer", "checkpoint+fused-optimizer"])
def test_predictions_within_5_percent(rows: dict[str, dict[str, Any]], name: str) -> None:
    row = rows[name]
    assert row["predicted_peak_bytes"] == pytest.approx(row["measured_peak_bytes"], rel=0.05)
    assert row["simulated_peak_bytes"] == pytest.approx(row["measured_peak_bytes"], rel=0.01)
