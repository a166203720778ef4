"""RLHF recommendations search combinations: for the seed's 70B PPO step (8 x H100, TP 8) no single
change fits, and the step fits only with the models offloaded between phases, the optimizer states
on the CPU and micro-batch 1 together - which the recommendations now propose. The phase table
shows each model's weights apart from its optimizer state."""

from __future__ import annotations

from typing import Any

from vramlens.cli import main
from vramlens.rlhf import load_rlhf, rlhf_estimate
from vramlens.rlhf.render.seed import SEED_SETUP


def test_the_seed_step_gets_the_combination_that_fits() -> None:
    report = rlhf_estimate(load_rlhf(SEED_SETUP))
    assert not report.fits
    first = report.recommendations[0]
    assert first.text.startswith("together: ") and first.text.endswith("(fits)")
    changes = {key: new for key, _, new in first.changes}
    assert changes["actor.cpu_offload"] == "optimizer" and changes["critic.cpu_offload"] == "optimizer"
    assert changes["micro_batch"] == 1
    assert {"critic.placement", "reward.placement", "reference.placement"} <= set(changes)
    # every other recommendation alone stays over
    assert all(r.text.endswith("(still over)") for r in report.recommendations[1:])
    # the combination re-estimated: the same peak, within the GPU
    swapped = dict(SEED_SETUP)
    swapped["micro_batch"] = 1
    swapped["offload"] = sorted(
        k.split(".")[0] for k, v in changes.items() if k.endswith(".placement") and v == "offload"
    )
    for role in ("actor", "critic"):
        swapped[role] = {"model": "llama-3.1-70b", "shard": changes[f"{role}.shard"], "cpu_offload": "optimizer"}
    again = rlhf_estimate(load_rlhf(swapped), recommend=False)
    assert again.fits and report.peak_device_bytes - again.peak_device_bytes == first.saves_bytes


def test_the_table_splits_weights_from_optimizer_state(capsys: Any) -> None:
    capsys.readouterr()
    assert main(["rlhf", "--algo", "ppo", "--actor", "llama-3.1-70b", "--gpu", "h100-80gb", "--gpus", "8", "--tp", "8",
                 "--prompt", "1024", "--response", "1024", "--rollout-batch", "32", "--no-timeline"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "actor* 197.3 (w 32.9 + opt 65.7)" in out and "reward 16.4," in out
