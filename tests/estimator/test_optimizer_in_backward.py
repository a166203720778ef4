"""The optimizer step inside backward (``optimizer_in_backward``) and Adafactor's temporaries,
against tracked real runs on CPU.

With the optimizer in backward each parameter is stepped in its post-accumulate-grad hook
(torchtune's ``optimizer_in_bwd``, forgather's ``fuse_optim_with_backward``): while the hook
runs, that parameter's gradient and the temporaries of a one-tensor step are alive beside every
activation not yet consumed. The LM head's hook runs first in backward, so with a large
vocabulary and few tokens it sets the step's peak (forgather's Samantha 16 GB configuration,
validation point p308: a Mistral 7B at 512 tokens whose 32k x 4096 head is stepped with
Adafactor's fp32 copies). Runs: a tiny Llama, transformers + AdamW or transformers' Adafactor,
``StorageTracker`` (tests/estimator/hf_step.py), backward-phase peak within 3%.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import requires_hf
from vramlens.estimator import estimate
from vramlens.estimator.runtime import TRAINING_CUBLAS_BYTES

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hf_step import TINY_LLAMA

pytestmark = [requires_hf, pytest.mark.hf]

#: Few tokens and checkpointed layers: the head's hook, not the activations, sets the peak
#: (before the hook was modelled the estimate was 3% to 52% under in these cases).
_FEW_TOKENS = {"batch": 1, "seq": 16, "recompute": True}
_TIED = {**TINY_LLAMA, "tie_word_embeddings": True}
_CASES = {
    "fused AdamW in backward": {"in_backward": True},
    "foreach AdamW in backward": {"in_backward": True, "optimizer_impl": "foreach"},
    "per-tensor AdamW in backward": {"in_backward": True, "optimizer_impl": "per-tensor"},
    "Adafactor in backward, bf16": {"in_backward": True, "optimizer": "adafactor"},
    "Adafactor in backward, fp32": {"in_backward": True, "optimizer": "adafactor", "precision": "fp32"},
    "Adafactor in backward, no recompute": {
        "in_backward": True,
        "optimizer": "adafactor",
        "recompute": False,
        "seq": 64,
    },
    "Adafactor after backward, bf16": {"optimizer": "adafactor"},
    # A tied table is stepped once both uses are accumulated: at the end of backward.
    "Adafactor in backward, tied table": {"in_backward": True, "optimizer": "adafactor", "config": _TIED},
}


def _phases(fields: dict) -> tuple[dict[str, int], dict[str, int]]:
    from hf_step import Step, measure_phases

    step = Step(**{**_FEW_TOKENS, **fields})
    measured = measure_phases(step)
    report = estimate(step.workload())
    estimated = {phase.name: phase.allocated_bytes - TRAINING_CUBLAS_BYTES for phase in report.phases}
    return measured, estimated


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_CASES))
def test_step_peaks_match_a_tracked_run(name: str) -> None:
    measured, estimated = _phases(_CASES[name])
    assert set(estimated) == set(measured)
    for phase, value in measured.items():
        assert estimated[phase] == pytest.approx(value, rel=0.03), phase


def test_adafactor_in_backward_in_the_fast_suite() -> None:
    """One tracked run outside the slow set: bf16 Adafactor stepped in backward (the head's four
    fp32 copies set the peak; without them the estimate was 52% under)."""
    measured, estimated = _phases(_CASES["Adafactor in backward, bf16"])
    assert estimated["backward"] == pytest.approx(measured["backward"], rel=0.03)
    workload = {"model": "llama-3.1-8b", "precision": "bf16", "optimizer": "adafactor", "batch": 1, "seq": 16}
    report = estimate({**workload, "optimizer_in_backward": True})
    backward = next(phase for phase in report.phases if phase.name == "backward")
    assert "optimizer step" in backward.note
