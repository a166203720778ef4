"""TRL fidelity: TRL 1.16's own ``SFTTrainer.train()`` and ``DPOTrainer.train()`` for two steps
on CPU under the tracker, against ``vramlens.estimator`` of the same workload (framework trl).

TRL's trainers compute the loss with their fused LM head (loss ``chunked-logprob``,
:mod:`vramlens.estimator.trl_head`): no logits, a ``[tokens, 32768]`` tile. Its Triton kernels
have a torch fallback on CPU that makes tile-sized fp32 temporaries a GPU never has; the run
replaces the fallback's whole-tile calls with calls on a few token rows (``triton_like_kernels``
in trl_trainer.py), so the tracked peak is the GPU's. The CUDA-only cuBLAS workspace is taken
out of the estimate.

DPO runs the policy on the chosen and the rejected rows as one batch of ``2 x batch``
(the workload says so) and the reference forward under ``no_grad`` after the policy's forward,
below the backward's peak. With LoRA the reference is the base with the adapters disabled: no
memory of its own. In full fine-tuning it is a second, frozen copy of the model: its weights
(the policy's parameter bytes: same model, same dtype) are added here as the RLHF engine adds a
separate reference role's resident weights (:mod:`vramlens.rlhf.models`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import requires_hf
from vramlens.categories import Category
from vramlens.estimator import estimate
from vramlens.estimator.runtime import TRAINING_CUBLAS_BYTES

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import datasets  # noqa: F401
    import trl  # noqa: F401

    HAVE_TRL = True
except ImportError:
    HAVE_TRL = False

pytestmark = [
    requires_hf,
    pytest.mark.skipif(not HAVE_TRL, reason="needs the [fidelity] extra (trl, datasets)"),
    pytest.mark.hf,
    pytest.mark.slow,
]

_RUNS = {
    "SFT full fine-tune": {},
    "SFT full fine-tune, gradient checkpointing": {"gradient_checkpointing": True},
    "SFT LoRA q,v": {"method": "lora"},
    "SFT LoRA q,v, gradient checkpointing": {"method": "lora", "gradient_checkpointing": True},
    "DPO LoRA q,v (reference: adapters disabled)": {"trainer": "dpo", "method": "lora"},
    "DPO full fine-tune, gradient checkpointing (reference: a frozen copy)": {
        "trainer": "dpo",
        "gradient_checkpointing": True,
    },
}


@pytest.mark.parametrize("name", list(_RUNS))
def test_trl_trainer_peak_matches_the_estimate(name: str) -> None:
    from trl_trainer import TrlRun, measure_trl

    run = TrlRun(**_RUNS[name])  # type: ignore[arg-type]
    measured = measure_trl(run)
    report = estimate(run.workload())
    estimated = report.allocated_bytes - TRAINING_CUBLAS_BYTES  # CUDA allocations the CPU run has not got
    if run.trainer == "dpo" and run.method == "full":
        estimated += report.peak.breakdown[Category.PARAMETERS]  # the reference model's frozen copy
    assert estimated == pytest.approx(measured, rel=0.03), f"estimate / tracked = {estimated / measured:.4f}"
