"""torchtune fidelity: torchtune 0.6.1's own single-device recipes (``FullFinetuneRecipeSingleDevice``,
``LoRAFinetuneRecipeSingleDevice``) for two steps on CPU under the tracker, against
``vramlens.estimator`` of the same workload (framework torchtune), one test per option its
users turn on (tests/estimator/torchtune_recipe.py runs them).

Two options cannot run on CPU as they run on a GPU, and the run says how it stands in:

* ``compile: True`` (``training.compile_model``: ``layer.compile()`` per decoder layer). Under
  the tracker (a ``TorchDispatchMode``) Dynamo leaves the layers eager (their outputs carry the
  eager ops' ``grad_fn``, not ``CompiledFunctionBackward``), and Inductor's CPU wrapper allocates
  its buffers with ``torch._C._dynamo.guards._empty_strided_cpu``, outside the dispatcher, where
  no tracker sees them. So the tracked run is the eager equivalent of the recipe: the same
  per-parameter optimizer hooks (``optimizer_in_bwd``) and the same layer-by-layer backward as
  layers compiled one by one, which is what the profile's ``compiles_per_layer`` rule is about
  (a whole-model compile would hold every gradient: about 8% more here). What the compiled
  layers keep for backward is checked apart, with saved-tensor hooks on a torchtune layer
  compiled by Inductor (:func:`test_compiled_torchtune_layer_keeps_what_the_estimate_counts`).
* ``enable_activation_offloading`` (the recipe refuses it off CUDA): torchtune's
  ``OffloadActivations`` runs with its CUDA streams as no-ops and its pinned host copies kept out
  of the count (:func:`torchtune_recipe.cuda_like_offloading`).

The CUDA-only cuBLAS workspace is taken out of the estimate.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from vramlens.estimator import estimate
from vramlens.estimator.runtime import TRAINING_CUBLAS_BYTES

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Not imported here: importing torchtune sets HF_HUB_ENABLE_HF_TRANSFER for the whole process
# (torchtune_recipe.import_torchtune keeps it from doing so).
HAVE_TORCHTUNE = all(importlib.util.find_spec(name) is not None for name in ("torchtune", "torchao", "omegaconf"))

pytestmark = [
    pytest.mark.skipif(not HAVE_TORCHTUNE, reason="needs the [fidelity] extra (torchtune, torchao)"),
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore"),  # torchao's and torchtune's import-time and deprecation warnings
]

#: Twelve narrow layers: the layer inputs that activation checkpointing keeps (and offloading
#: moves to the host) are a large share of a LoRA run's memory only when there are many of them
#: (offloading takes 10% off this run's tracked peak).
_NARROW = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 12,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 2000,
    "max_position_embeddings": 512,
}

_RUNS: dict[str, dict[str, Any]] = {
    "full fine-tune, chunked cross-entropy (CEWithChunkedOutputLoss)": {},
    "full fine-tune, activation checkpointing": {"checkpointing": True},
    "per-layer compile + optimizer in backward, checkpointing (eager equivalent)": {
        "compile": True,
        "optimizer_in_bwd": True,
        "checkpointing": True,
    },
    "LoRA, activation checkpointing + offloading": {
        "method": "lora",
        "checkpointing": True,
        "offloading": True,
        "batch": 2,
        "seq": 256,
        "model": tuple(_NARROW.items()),
    },
}


@pytest.mark.parametrize("name", list(_RUNS))
def test_torchtune_recipe_peak_matches_the_estimate(name: str) -> None:
    from torchtune_recipe import TorchtuneRun, measure_torchtune

    run = TorchtuneRun(**_RUNS[name])
    measured = measure_torchtune(run)
    estimated = estimate(run.workload()).allocated_bytes - TRAINING_CUBLAS_BYTES
    assert estimated == pytest.approx(measured, rel=0.03), f"estimate / tracked = {estimated / measured:.4f}"


def test_lora_on_the_output_projection_costs_what_the_estimate_adds() -> None:
    """``apply_lora_to_output``: a LoRA adapter on the output projection, run chunk by chunk by the
    chunked head (its input chunk kept by ``lora_a``, the rank-r output by ``lora_b``). The run is
    within 3% with and without it, and the adapter's own cost (about 1% of this run) within 3% too."""
    from torchtune_recipe import TorchtuneRun, measure_torchtune

    peaks, estimates = [], []
    for output in (False, True):
        run = TorchtuneRun(method="lora", lora_output=output)
        peaks.append(measure_torchtune(run))
        estimates.append(estimate(run.workload()).allocated_bytes - TRAINING_CUBLAS_BYTES)
    assert estimates[1] == pytest.approx(peaks[1], rel=0.03), f"estimate / tracked = {estimates[1] / peaks[1]:.4f}"
    assert estimates[1] - estimates[0] == pytest.approx(peaks[1] - peaks[0], rel=0.03)


@pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor on CPU needs a C++ compiler")
def test_compiled_torchtune_layer_keeps_what_the_estimate_counts() -> None:
    """A torchtune decoder layer compiled as ``training.compile_model`` compiles it keeps, per token,
    what the estimator's ``compile: true`` layer counts (AOTAutograd's partitioner decides, before
    Inductor's device code: the CPU answer is the CUDA one)."""
    from torchtune_recipe import TorchtuneRun, compiled_layer_saved_per_token

    from vramlens.estimator.activations import layer_saved_parts
    from vramlens.estimator.recompute import layer_recipe, train_state
    from vramlens.resolve.context import resolve_training
    from vramlens.workload.load import load_workload

    run = TorchtuneRun(compile=True)
    workload = load_workload(run.workload())
    ctx = resolve_training(workload.model, workload)  # type: ignore[arg-type]
    counted = sum(
        part.bytes_per_token for part in layer_saved_parts(layer_recipe(ctx, train_state(ctx, frozenset()), []))
    )
    assert compiled_layer_saved_per_token(run) == counted
