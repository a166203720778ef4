"""QLoRA fidelity: transformers' 4-bit load (bitsandbytes' CPU backend), PEFT's
``prepare_model_for_kbit_training`` and two HF ``Trainer`` steps on CPU under the tracker,
against ``vramlens.estimator`` of the same workload (framework hf, method qlora).

The load is checked against the estimate's ``load`` phase: the preparation casts one weight at a
time to fp32, so the loaded bf16 table and its fp32 copy are alive together
(:func:`vramlens.estimator.qlora.prepare_cast_bytes`). The training steps are compared as in
test_trainer_hf.py: Trainer's ``compute_loss`` drops the fp32 logits the hf profile keeps, and the
CUDA-only cuBLAS workspace is taken out.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import requires_hf
from vramlens.estimator import estimate
from vramlens.estimator.runtime import CUBLAS_WORKSPACE_BYTES, TRAINING_CUBLAS_BYTES

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import bitsandbytes  # noqa: F401

    HAVE_BNB = True
except ImportError:
    HAVE_BNB = False

pytestmark = [
    requires_hf,
    pytest.mark.skipif(not HAVE_BNB, reason="needs bitsandbytes (the [fidelity] extra)"),
    pytest.mark.hf,
    pytest.mark.slow,
]


def test_qlora_load_and_steps_match_the_estimate() -> None:
    """NF4 with double quantization (the QLoRA paper's, ``method: qlora``'s default), under autocast."""
    from hf_qlora import QloraRun, measure_qlora

    run = QloraRun(double_quant=True)
    measured = measure_qlora(run)
    report = estimate(run.workload())
    load = next(phase for phase in report.phases if phase.name == "load")
    assert load.allocated_bytes == pytest.approx(measured.load, rel=0.03), f"{load.allocated_bytes / measured.load:.4f}"
    estimated = report.allocated_bytes - TRAINING_CUBLAS_BYTES  # CUDA allocations the CPU run has not got
    kept_outputs = run.batch * run.seq * report.workload.model.vocab_size * 4  # type: ignore[union-attr]
    assert estimated >= measured.train
    ratio = (estimated - kept_outputs) / measured.train
    assert ratio == pytest.approx(1, rel=0.03), f"estimate / tracked = {ratio:.4f}"


def test_a_short_qlora_steps_load_and_step() -> None:
    """One 16-token row without autocast, Llama 3's vocabulary (128256): the loaded bf16 table beside
    everything else at the cast is 39 MiB above the step's tensors, more than the main thread's
    cuBLAS workspace but less than it and the autograd thread's together (the second comes with the
    first backward's first matmul, runtime.TRAINING_CUBLAS_BYTES), so on a GPU the step is the peak.
    (Under autocast the step makes a bf16 copy of the fp32 head of the same size, kept from the
    head's forward to its backward, so the step is higher still.) The estimate's step phases keep
    the logits Trainer drops (test_trainer_hf.py)."""
    from hf_qlora import QloraRun, measure_qlora

    run = QloraRun(batch=1, seq=16, autocast=False, vocab=128256)
    measured = measure_qlora(run)
    report = estimate(run.workload())
    assert measured.train + CUBLAS_WORKSPACE_BYTES < measured.load < measured.train + TRAINING_CUBLAS_BYTES
    load = next(phase for phase in report.phases if phase.name == "load")
    assert load.allocated_bytes == pytest.approx(measured.load, rel=0.03)
    kept_outputs = run.batch * run.seq * run.vocab * 4
    step = max(phase.allocated_bytes for phase in report.phases if phase.name != "load")
    assert step - kept_outputs > load.allocated_bytes
    assert step - kept_outputs - TRAINING_CUBLAS_BYTES == pytest.approx(measured.train, rel=0.03)
