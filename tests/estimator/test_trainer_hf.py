"""HF Trainer fidelity: transformers' own ``Trainer.train()`` for two steps on CPU under the
tracker, against ``vramlens.estimator`` of the same workload (framework hf).

Trainer differs from the hand loop of tests/estimator/hf_step.py in one term: its
``compute_loss`` returns the loss alone, so the model outputs (accelerate's fp32 copy of the
logits under ``bf16=True``) die before backward. The hf profile keeps them on purpose
(``FrameworkProfile.keeps_logits``: it never under-estimates either loop), so the estimate is
checked to be above the tracked peak, and within 3% of it once that one term is taken out.
Everything else Trainer adds (fused AdamW, ``clip_grad_norm_``'s foreach norms, ``zero_grad``
with ``set_to_none``, the loss scaled by the items in the batch) is in the comparison.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import requires_hf
from vramlens.estimator import estimate
from vramlens.estimator.runtime import TRAINING_CUBLAS_BYTES

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytestmark = [requires_hf, pytest.mark.hf, pytest.mark.slow]

_RUNS = {
    "full fine-tune, gradient checkpointing": {"gradient_checkpointing": True},
    "PEFT LoRA q,v + lm_head": {"method": "lora", "targets": ("q_proj", "v_proj", "lm_head"), "batch": 2, "seq": 64},
}


@pytest.mark.parametrize("name", list(_RUNS))
def test_trainer_peak_matches_the_estimate(name: str) -> None:
    from hf_trainer import TrainerRun, measure_trainer

    run = TrainerRun(**_RUNS[name])  # type: ignore[arg-type]
    measured = measure_trainer(run)
    report = estimate(run.workload())
    estimated = report.allocated_bytes - TRAINING_CUBLAS_BYTES  # CUDA allocations the CPU run has not got
    vocab = report.workload.model.vocab_size  # type: ignore[union-attr]
    kept_outputs = run.batch * run.seq * vocab * 4  # fp32 logits the hand loop keeps through backward
    assert estimated >= measured
    assert estimated - kept_outputs == pytest.approx(measured, rel=0.03)
