"""bitsandbytes' paged optimizers under HF Trainer: two steps on CPU under the tracker with the
paging their CUDA path does (``cuda_paging`` in bnb_paged.py), against ``vramlens.estimator``.

A paged buffer lives in CUDA unified memory: nvidia-smi sees it while resident,
``max_memory_allocated`` never. bitsandbytes pages a state buffer only for tensors of at least 1e5
elements, so the tracked (allocated) peak keeps the state of every smaller tensor (all of a LoRA
run's adapters) and the 8-bit absmax vectors; the estimate counts the same per tensor
(:mod:`vramlens.estimator.paged`) and puts the paged bytes at the device level only
(``runtime["paged_optimizer_state"]``), which must equal the paged buffers' bytes. Trainer's
``compute_loss`` drops the fp32 logits the hf profile keeps, as in test_trainer_hf.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import requires_hf
from vramlens.estimator.paged import PAGED_MIN_ELEMENTS, state_split

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import bitsandbytes  # noqa: F401

    HAVE_BNB = True
except ImportError:
    HAVE_BNB = False

_RUNS = {
    "full fine-tune, paged_adamw_8bit": {"optim": "paged_adamw_8bit"},
    # The QLoRA guides' optimizer: every adapter matrix is under 1e5 elements, so nothing is paged.
    "PEFT LoRA q,v,gate, paged_adamw_32bit (nothing paged)": {
        "optim": "paged_adamw_32bit",
        "method": "lora",
        "targets": ("q_proj", "v_proj", "gate_proj"),
    },
}


def test_the_state_of_small_tensors_is_never_paged() -> None:
    """By hand: fp32 moments under 4096 elements, uint8 + absmax above, paged from 1e5 elements."""
    sizes = [1000, 65536, PAGED_MIN_ELEMENTS]
    assert state_split(sizes, eight_bit=False, paged=True) == (8 * (1000 + 65536), 8 * PAGED_MIN_ELEMENTS)
    absmax = 8 * (256 + 391)  # two fp32 absmax per 256-element block, of the two 8-bit tensors
    assert state_split(sizes, eight_bit=True, paged=True) == (8 * 1000 + 2 * 65536 + absmax, 2 * PAGED_MIN_ELEMENTS)
    assert state_split(sizes, eight_bit=True, paged=False) == (8 * 1000 + 2 * (65536 + PAGED_MIN_ELEMENTS) + absmax, 0)


@requires_hf
@pytest.mark.skipif(not HAVE_BNB, reason="needs bitsandbytes (the [fidelity] extra)")
@pytest.mark.hf
@pytest.mark.slow
@pytest.mark.parametrize("name", list(_RUNS))
def test_paged_state_is_outside_the_tracked_peak_and_the_estimate_agrees(name: str) -> None:
    from bnb_paged import cuda_paging
    from hf_trainer import TrainerRun, measure_trainer

    from vramlens.estimator import estimate
    from vramlens.estimator.runtime import TRAINING_CUBLAS_BYTES

    run = TrainerRun(**_RUNS[name])  # type: ignore[arg-type]
    with cuda_paging() as paged:
        measured = measure_trainer(run)
    report = estimate(run.workload())
    assert report.runtime.get("paged_optimizer_state", 0) == sum(buffer.nbytes for buffer in paged)
    kept_outputs = run.batch * run.seq * report.workload.model.vocab_size * 4  # type: ignore[union-attr]
    estimated = report.allocated_bytes - TRAINING_CUBLAS_BYTES - kept_outputs
    assert estimated == pytest.approx(measured, rel=0.03), f"estimate / tracked = {estimated / measured:.4f}"
