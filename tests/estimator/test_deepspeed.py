"""DeepSpeed fidelity: ``deepspeed.initialize`` + ``engine.backward``/``engine.step`` (DeepSpeed
0.19.8's CPU accelerator, gloo; HF's example ZeRO configs with the values HF Trainer fills for
``auto``; bf16) on two CPU processes, per-rank tracked peak against ``vramlens.estimator`` (framework
deepspeed, ``precision: mixed-bf16``: bf16 parameters and gradients, fp32 master weights and states
partitioned). DeepSpeed's CUDA FusedAdam is replaced by torch's fused AdamW (in place, like it).
The CUDA-only cuBLAS workspace is taken out of the estimate.

ZeRO-3 runs with HF's example values (``stage3_max_live_parameters`` and ``stage3_max_reuse_distance``
1e9: the tiny model is gathered whole from the second layer's forward into the backward), with both
small enough to matter (2e6 live elements, reuse distance 1.1e6: the prefetch stops at the live
bound, the head and the last layer's ``down_proj`` stay gathered into the backward), and with every
layer checkpointed, no prefetch and a reuse distance of 3e6 (the head and the whole last layer kept:
the recomputed forward is where they are used again), set through the workload keys of the same
names (:mod:`vramlens.estimator.zero3`). The cases run in one pair of processes (deepspeed_run.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import requires_hf
from vramlens.estimator import estimate
from vramlens.estimator.runtime import TRAINING_CUBLAS_BYTES

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import deepspeed  # noqa: F401

    HAVE_DEEPSPEED = True
except ImportError:
    HAVE_DEEPSPEED = False

pytestmark = [
    requires_hf,
    pytest.mark.skipif(not HAVE_DEEPSPEED, reason="needs deepspeed (installed with --no-build-isolation by .ci/run)"),
    pytest.mark.hf,
    pytest.mark.slow,
]

_BATCH, _SEQ, _RANKS = 4, 128, 2
#: A live bound and a reuse distance of the order of the tiny model's 3.8e6 elements.
_SMALL = {"stage3_max_live_parameters": 2_000_000, "stage3_max_reuse_distance": 1_100_000}
#: No prefetch; a reuse distance that keeps the head and, with every layer checkpointed, the whole last layer.
_REUSE = {"stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 3_000_000}
#: (ZeRO stage, zero_optimization keys, gradient checkpointing of every layer)
_CASES: list[tuple[int, dict[str, int], bool]] = [(2, {}, False), (3, {}, False), (3, _SMALL, False), (3, _REUSE, True)]
_IDS = ["zero2", "zero3", "zero3-small-live-and-reuse", "zero3-reuse-checkpointed"]


@pytest.fixture(scope="module")
def peaks() -> list[list[int]]:
    """Each case's tracked peak per rank (one run of deepspeed_run.py for all cases)."""
    script = Path(__file__).resolve().parent / "deepspeed_run.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    args = [sys.executable, str(script), str(_RANKS), str(_BATCH), str(_SEQ), json.dumps(_CASES)]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith('{"peaks"'))
    found: list[list[int]] = json.loads(line)["peaks"]
    return found


def _estimate(stage: int, zero: dict[str, int], checkpointed: bool = False) -> int:
    from hf_step import TINY_LLAMA

    from vramlens.model.resolve import model_from_config

    workload = {
        "model": model_from_config(dict(TINY_LLAMA)),
        "framework": "deepspeed",
        "precision": "mixed-bf16",
        "batch": _BATCH,
        "seq": _SEQ,
        "recompute": "full" if checkpointed else "none",
        "parallel": {"gpus": _RANKS, "shard": f"zero{stage}", **zero},
    }
    return estimate(workload).allocated_bytes - TRAINING_CUBLAS_BYTES


@pytest.mark.parametrize("case", range(len(_CASES)), ids=_IDS)
def test_zero_step_peak_matches_the_estimate(peaks: list[list[int]], case: int) -> None:
    stage, zero, checkpointed = _CASES[case]
    tracked = peaks[case]
    assert len(tracked) == _RANKS and len(set(tracked)) == 1
    estimated = _estimate(stage, zero, checkpointed)
    assert estimated == pytest.approx(tracked[0], rel=0.03), f"estimate / tracked = {estimated / tracked[0]:.4f}"


def test_the_small_zero3_sizes_change_the_peak(peaks: list[list[int]]) -> None:
    """The live bound and the reuse distance are what the small case tests: its tracked peak is lower
    by more than the 3% tolerance, and so is its estimate."""
    assert peaks[2][0] < 0.97 * peaks[1][0]
    assert _estimate(3, _SMALL) < 0.97 * _estimate(3, {})
