"""The ``plain`` framework profile: a hand-written PyTorch loop (seed 002's) - torch.optim.AdamW
with its defaults (foreach on CUDA), full logits, nothing fused, the loss outside the model.

Seed 002 trains Qwen2.5-1.5B in fp32 on (16, 256) and (2, 256) batches and observes the peak
move from the forward/backward boundary to the optimizer step as the batch shrinks. Under the
hf profile (fused AdamW: no step temporaries) that never happens; with ``--framework plain`` it
does, with no other flag."""

from __future__ import annotations

from vramlens.estimator import estimate
from vramlens.resolve.frameworks import FRAMEWORKS, PLAIN_NOTE, profile_for
from vramlens.workload.options import Framework, LossImpl, OptimizerImpl

SEED = {"model": "qwen2.5-1.5b", "precision": "fp32", "seq": 256}


def test_the_seed_peak_moves_to_the_optimizer_step_as_the_batch_shrinks() -> None:
    assert estimate({**SEED, "batch": 16, "framework": "plain"}).peak_phase == "backward"
    small = estimate({**SEED, "batch": 2, "framework": "plain"})
    assert small.peak_phase == "optimizer_step"
    # the foreach step keeps a temporary as large as the parameters of a dtype group
    temporaries = [t for t in small.terms if t.name.startswith("optimizer step temporaries")]
    assert temporaries and temporaries[0].name == "optimizer step temporaries (foreach)"
    # under hf (fused AdamW) the same small batch still peaks in backward
    assert estimate({**SEED, "batch": 2, "framework": "hf"}).peak_phase == "backward"


def test_plain_defaults_are_a_hand_written_loops() -> None:
    profile, note = profile_for(Framework.PLAIN)
    assert profile is FRAMEWORKS[Framework.PLAIN]
    assert (profile.optimizer_impl, profile.loss) == (OptimizerImpl.FOREACH, LossImpl.FULL)
    assert not profile.keeps_logits and not profile.loss_in_model and not profile.compiles_loss
    assert note is None
    report = estimate({**SEED, "batch": 2, "framework": "plain"})
    assert PLAIN_NOTE in report.assumptions and "torch.autocast" in PLAIN_NOTE
    assert "optimizer_impl auto: foreach (plain default)" in report.assumptions
    # the logits die after the loss (hf's loop keeps its outputs object, and them, through backward):
    # one fp32 [2, 256, vocab] tensor less at the start of backward, nothing else differs
    hf = estimate({**SEED, "batch": 2, "framework": "hf", "optimizer_impl": "foreach"})
    phases = {p.name: p.allocated_bytes for p in report.phases}
    hf_phases = {p.name: p.allocated_bytes for p in hf.phases}
    assert hf_phases["backward"] - phases["backward"] == 2 * 256 * 151936 * 4
    assert phases["forward"] == hf_phases["forward"] and phases["optimizer_step"] == hf_phases["optimizer_step"]
