"""LitGPT fidelity: the body of ``litgpt.finetune.lora.fit`` (litgpt 0.5.13's own ``GPT`` with
``LoRAQKVLinear``, ``chunked_cross_entropy`` and Lightning Fabric ``bf16-true``) for two steps on
CPU under the tracker, against ``vramlens.estimator`` of the same workload (framework litgpt).

Known gap (the test is a strict xfail until the litgpt profile models it): the estimate is 0.85-0.88
of the tracked peak. Found in the tracked run (capture_stacks), at the peak (the start of backward):
* Fabric's ``bf16-true`` precision returns the model's outputs in fp32
  (``HalfPrecision.convert_output``, lightning/fabric/plugins/precision/half.py:63): an fp32 copy
  of the logits chunks, ``b x s x V x 4`` bytes, which the loop's ``logits`` list keeps alive through
  ``fabric.backward``;
* ``chunked_cross_entropy`` (litgpt/utils.py:325) runs ``cross_entropy`` on those fp32 chunks: its
  log-softmax output (saved for backward) and, in backward, two more fp32 tensors of the chunk;
* the layers keep about 1.1 kB per token and layer more than the hf-style terms (``LoRAQKVLinear``'s
  ``zero_pad`` of the fused qkv, ``repeat_interleave``'d keys and values saved by SDPA).
The profile's ``keeps_logits=False`` and bf16 loss are therefore wrong for litgpt's own loop.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vramlens.estimator import estimate
from vramlens.estimator.runtime import CUBLAS_WORKSPACE_BYTES

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import lightning  # noqa: F401
    import litgpt  # noqa: F401

    HAVE_LITGPT = True
except ImportError:
    HAVE_LITGPT = False

pytestmark = [
    pytest.mark.skipif(not HAVE_LITGPT, reason="needs litgpt and lightning (installed with --no-deps by .ci/run)"),
    pytest.mark.slow,
]


@pytest.mark.xfail(
    strict=True,
    reason="litgpt profile: Fabric bf16-true returns fp32 logits kept by the loop through backward, fp32 chunked "
    "cross-entropy, LoRAQKVLinear/repeat_interleave saved tensors (estimate 0.85-0.88 of tracked)",
)
def test_litgpt_lora_step_peak_matches_the_estimate() -> None:
    from litgpt_step import LitgptRun, measure_litgpt

    run = LitgptRun(batch=2, seq=128)
    measured = measure_litgpt(run)
    estimated = estimate(run.workload()).allocated_bytes - CUBLAS_WORKSPACE_BYTES  # CUDA only
    assert estimated == pytest.approx(measured, rel=0.03), f"estimate / tracked = {estimated / measured:.4f}"


def _fsdp_peaks(batch: int, seq: int) -> list[int]:
    """Per-rank tracked peaks of litgpt_fsdp_run.py (its own two processes, launched by Fabric)."""
    import json
    import os
    import subprocess

    script = Path(__file__).resolve().parent / "litgpt_fsdp_run.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, str(script), str(batch), str(seq)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith('{"peaks"'))
    peaks: list[int] = json.loads(line)["peaks"]
    return peaks


@pytest.mark.xfail(
    strict=True,
    reason="litgpt FSDP2 LoRA (ModelParallelStrategy): estimate 1.05 of the tracked per-rank peak; the litgpt "
    "profile's logits and loss terms are the open question (see the single-process case)",
)
def test_litgpt_fsdp_on_two_cpu_processes_matches_the_estimate() -> None:
    """``litgpt finetune lora --devices 2``'s strategy: Fabric ModelParallelStrategy with litgpt's
    ``parallelize_fn`` (FSDP2 ``fully_shard`` per checkpoint-wrapped Block and the root; activation
    checkpointing on), two CPU processes over gloo."""
    from litgpt_step import LitgptRun

    peaks = _fsdp_peaks(2, 128)
    assert len(peaks) == 2 and peaks[0] == peaks[1]
    workload = LitgptRun(batch=2, seq=128).workload() | {"parallel": {"gpus": 2, "shard": "fsdp"}, "recompute": "full"}
    estimated = estimate(workload).allocated_bytes - CUBLAS_WORKSPACE_BYTES  # CUDA only
    assert estimated == pytest.approx(peaks[0], rel=0.03), f"estimate / tracked = {estimated / peaks[0]:.4f}"
