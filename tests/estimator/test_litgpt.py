"""LitGPT fidelity: the body of ``litgpt.finetune.lora.fit`` (litgpt 0.5.13's own ``GPT`` with
``LoRAQKVLinear``, ``chunked_cross_entropy`` and Lightning Fabric ``bf16-true``) for two steps on
CPU under the tracker, against ``vramlens.estimator`` of the same workload (framework litgpt).

Fixed from this run (the litgpt profile, ``keeps_logits`` and ``outputs_fp32``): Fabric's
``bf16-true`` precision returns the model's outputs in fp32 (``HalfPrecision.convert_output``,
lightning/fabric/plugins/precision/half.py:63), the loop's ``logits`` list keeps them alive through
``fabric.backward``, and ``chunked_cross_entropy`` (litgpt/utils.py:325) runs on those fp32 chunks:
at the start of backward the fp32 logits, the fp32 log-probabilities and two fp32 gradients of a
chunk (seen in the tracked run with ``capture_stacks``; the estimate's logits terms now equal them).

Known gaps (strict xfails until modelled): single process, the estimate is 0.95 of tracked: the
layers keep about 1.1 kB per token and layer more than the hf-style terms (``LoRAQKVLinear``'s
fused qkv and ``zero_pad``, ``repeat_interleave``'d keys and values saved by SDPA); under litgpt's
FSDP2 (two CPU processes) it is 1.19: the ``root`` rule counts two whole layers gathered at the
loss and the start of backward, where FSDP2 reshards each Block after its forward.
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

_NEEDS_LITGPT = pytest.mark.skipif(
    not HAVE_LITGPT, reason="needs litgpt and lightning (installed with --no-deps by .ci/run)"
)


def test_litgpt_logits_are_fp32_and_kept_through_backward() -> None:
    """The terms the tracked run showed at the start of backward (batch 2, one 128-position chunk):
    fp32 logits kept by the loop, fp32 log-probabilities, two fp32 gradients of the chunk: 16 B per
    logit; at the loss, the fp32 logits, the log-probabilities and the chunk's fp32 input: 12 B."""
    from vramlens.model.resolve import model_from_config

    tiny = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
            "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 2000, "max_position_embeddings": 4096}  # fmt: skip
    workload = {"model": model_from_config(tiny), "framework": "litgpt", "precision": "bf16", "method": "lora",
                "batch": 2, "seq": 128, "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]}}  # fmt: skip
    terms = {term.name: term.bytes for phase in estimate(workload).phases for term in phase.terms}
    logits = 2 * 128 * 2000
    assert terms["loss gradient beside the kept logits (start of backward)"] == 16 * logits
    assert terms["logits and loss (at the loss)"] == 12 * logits


@_NEEDS_LITGPT
@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="litgpt layers: LoRAQKVLinear/repeat_interleave keep ~1.1 kB/token/layer more than the hf-style terms "
    "(estimate 0.95 of tracked)",
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


@_NEEDS_LITGPT
@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="litgpt FSDP2 LoRA (ModelParallelStrategy): estimate 1.19 of the tracked per-rank peak; the root rule "
    "keeps two whole layers gathered at the loss and the start of backward",
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
