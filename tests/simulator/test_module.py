"""``simulate_module``: your own nn.Module and step on fake tensors, against hand arithmetic and real runs."""

from __future__ import annotations

import subprocess
import sys
import warnings
from typing import Any

import pytest

from conftest import requires_hf
from vramlens import InputError, SimulationError, simulate_module, track
from vramlens.categories import Category

torch = pytest.importorskip("torch")
nn = torch.nn

BATCH = 8
MIB = 2**20
#: Linear(1024, 4096) + Linear(4096, 1024) in fp32: two 4 MiB-element weights and their biases.
PARAMETER_BYTES = (4096 * 1024 + 4096 + 1024 * 4096 + 1024) * 4  # 33,574,912
INPUT_BYTES = BATCH * 1024 * 4  # x: 8 x 1024 fp32 = 32 KiB
HIDDEN_BYTES = BATCH * 4096 * 4  # one 8 x 4096 fp32 hidden tensor = 128 KiB
CUBLAS_WORKSPACE = 32 * MIB


def build() -> Any:
    """The MLP of every test here (fp32)."""
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))


def batch() -> Any:
    return torch.randn(BATCH, 1024)


def sgd(params: Any) -> Any:
    """Plain SGD: no momentum, so no state and no temporaries in its step (in-place ``add_``)."""
    return torch.optim.SGD(params, lr=1e-3)


def train(model: Any, optimizer: Any, x: Any) -> None:
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def infer(model: Any, optimizer: Any, x: Any) -> None:
    with torch.no_grad():
        model(x)


def real_peak(make_optimizer: Any, steps: int = 2) -> int:
    """Peak live tensor bytes of the same steps on real CPU tensors, tracked by vramlens.track."""
    torch.manual_seed(0)
    model = build()
    optimizer = make_optimizer(list(model.parameters()))
    x = batch()
    with track(model, optimizer, x) as tracker:
        for _ in range(steps):
            train(model, optimizer, x)
    return tracker.peak


def test_training_peak_equals_the_hand_count_to_the_byte() -> None:
    report = simulate_module(build, train, optimizer=sgd, inputs=batch)
    assert report.timeline is not None
    # The peak is at the end of Linear(1024, 4096)'s backward, when its weight gradient exists:
    #   parameters                    33,574,912
    # + gradients (all four)          33,574,912   (Linear 2's were made first and are kept)
    # + inputs x                          32,768
    # + loss (fp32 scalar)                     4
    # + loss's seed gradient (ones)            4   (sum's backward expands it: a view, no copy)
    # + gradient of the hidden layer     131,072   (ReLU's backward output, 8 x 4096, read by Linear 1's backward)
    # The ReLU output (saved activation) and its gradient were freed when ReLU's backward ended;
    # plain SGD updates in place, so its step allocates nothing.
    tensor_peak = 2 * PARAMETER_BYTES + INPUT_BYTES + 4 + 4 + HIDDEN_BYTES
    assert tensor_peak == 67_313_672
    assert report.timeline.peak_bytes == tensor_peak
    assert report.peak_phase == "backward"
    # allocated: each tensor in 512-byte blocks (the two 4-byte scalars take 512 each) + the cuBLAS
    # workspaces of the main thread and of the autograd thread (made by the first backward's first matmul).
    assert report.allocated_bytes == tensor_peak - 8 + 2 * 512 + 2 * CUBLAS_WORKSPACE
    breakdown = report.breakdown
    assert breakdown[Category.PARAMETERS] == PARAMETER_BYTES
    assert breakdown[Category.GRADIENTS] == PARAMETER_BYTES
    assert breakdown[Category.INPUTS] == INPUT_BYTES
    assert breakdown[Category.TEMPORARY] == HIDDEN_BYTES
    assert Category.OPTIMIZER_STATE not in breakdown


@pytest.mark.parametrize("make_optimizer", [sgd, torch.optim.AdamW], ids=["sgd", "adamw"])
def test_fake_peak_equals_the_real_tracked_peak_to_the_byte(make_optimizer: Any) -> None:
    report = simulate_module(build, train, optimizer=make_optimizer, inputs=batch)
    assert report.timeline is not None
    assert report.timeline.peak_bytes == real_peak(make_optimizer)


def test_adamw_state_is_optimizer_state() -> None:
    report = simulate_module(build, train, optimizer=torch.optim.AdamW, inputs=batch)
    phases = {phase.name: phase for phase in report.phases}
    assert set(phases) == {"forward", "backward", "optimizer_step"}
    state = phases["optimizer_step"].breakdown[Category.OPTIMIZER_STATE]
    # exp_avg and exp_avg_sq per parameter (2 x parameters) + one fp32 step counter per tensor (4 x 512 B blocks).
    assert state == 2 * PARAMETER_BYTES + 4 * 512


def test_inference_step_without_optimizer() -> None:
    report = simulate_module(build, infer, inputs=batch, steps=1, name="mlp")
    assert report.model == "mlp"
    assert [phase.name for phase in report.phases] == ["forward"]
    assert report.timeline is not None
    # Under no_grad: parameters + x + the first Linear's output and ReLU's output (both 8 x 4096, alive at once).
    assert report.timeline.peak_bytes == PARAMETER_BYTES + INPUT_BYTES + 2 * HIDDEN_BYTES
    assert Category.GRADIENTS not in report.breakdown


def test_report_names_what_ran() -> None:
    report = simulate_module(build, train, optimizer=sgd, inputs=batch, gpu="h100")
    assert report.model == "Sequential"
    assert report.engine == "simulate"
    assert report.fits is True
    assert report.workload_dict == {
        "model": "Sequential",
        "source": "module",
        "build": "build",
        "step": "train",
        "optimizer": "SGD",
        "steps": 2,
        "gpu": "h100-sxm-80gb",
    }
    assert any("built by build()" in note and "8.39M parameters" in note for note in report.assumptions)
    assert any("train(model, optimizer, inputs) ran 2 time(s) with optimizer SGD" in n for n in report.assumptions)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"build": build, "step": train, "steps": 0}, "steps: 0; accepted: an integer from 1 to 100"),
        ({"build": build, "step": train, "steps": True}, "steps: True"),
        ({"build": "mlp", "step": train}, "build: 'mlp' (str) is not callable"),
        ({"build": build, "step": None}, "step: None (NoneType) is not callable"),
        ({"build": build, "step": train, "optimizer": 0.1}, "optimizer: 0.1 (float) is not callable"),
        ({"build": lambda: 3, "step": train}, "build: returned 3 (int), not a torch.nn.Module"),
        ({"build": lambda: nn.Linear(2, 2, device="meta"), "step": train}, "build: weight is on the meta device"),
        ({"build": build, "step": train, "optimizer": lambda params: 3}, "optimizer: returned 3 (int)"),
        ({"build": build, "step": train, "gpu": 80}, "gpu: 80 (int); accepted"),
        ({"build": build, "step": train, "name": ""}, "name: '' (str); accepted"),
    ],
)
def test_bad_arguments_give_one_line_errors(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as caught:
        simulate_module(**arguments)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_model_made_outside_build_is_refused() -> None:
    model = build()  # real weights
    with pytest.raises(InputError, match=r"^build: 0\.weight is a real tensor .* build=lambda: MyModel\(\)$"):
        simulate_module(lambda: model, train, optimizer=sgd, inputs=batch)


def test_branching_on_tensor_values_is_a_one_line_simulation_error() -> None:
    def branching(model: Any, optimizer: Any, x: Any) -> None:
        out = model(x)
        if out.sum() > 0:  # needs the value: fake tensors have none
            out.sum().backward()

    with pytest.raises(SimulationError) as caught:
        simulate_module(build, branching, inputs=batch)
    message = str(caught.value)
    assert message.startswith("step: cannot simulate step 1 of 2 of Sequential: it depends on tensor values")
    assert "DataDependentOutputException" in message
    assert "`vramlens estimate`" in message
    assert "\n" not in message


def test_a_failing_build_names_the_stage() -> None:
    with pytest.raises(SimulationError, match=r"^build: cannot simulate build\(\) of <lambda>: .*ZeroDivisionError"):
        simulate_module(lambda: 1 / 0, train)


def test_a_step_that_runs_no_module_is_refused() -> None:
    with pytest.raises(SimulationError, match=r"^step: the last step of Sequential allocated nothing"):
        simulate_module(build, lambda model, optimizer, inputs: None)


def test_import_vramlens_stays_light() -> None:
    code = "import sys, vramlens; vramlens.simulate_module; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


@requires_hf
@pytest.mark.hf
def test_a_transformers_model_matches_a_real_run_and_simulate() -> None:
    import transformers

    from vramlens import model_from_config, simulate

    values = {"hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 2, "num_attention_heads": 4}
    values |= {"num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096}
    config = transformers.LlamaConfig(**values, use_cache=False, attn_implementation="sdpa")

    def build_llama() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).train()

    def hf_step(model: Any, optimizer: Any, ids: Any) -> None:
        # HF Trainer's step keeps the output (and its logits) alive through backward, as simulate() does;
        # ``model(...).loss.backward()`` would free the 256,000 B of bf16 logits before backward.
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        del out
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def adamw(params: Any) -> Any:
        return torch.optim.AdamW(params, fused=True)

    def ids() -> Any:
        return torch.randint(0, 1000, (2, 64))

    report = simulate_module(build_llama, hf_step, optimizer=adamw, inputs=ids)
    model, tokens = build_llama(), ids()
    optimizer = adamw(list(model.parameters()))
    with track(model, optimizer, tokens) as tracker:
        for _ in range(2):
            hf_step(model, optimizer, tokens)
    workload = {"model": model_from_config({"model_type": "llama", **values}), "framework": "hf", "batch": 2}
    workload |= {"seq": 64, "precision": "bf16", "optimizer_impl": "fused", "attention": "sdpa"}
    assert report.timeline is not None
    assert report.timeline.peak_bytes == tracker.peak
    assert report.allocated_bytes == simulate(workload).allocated_bytes


def test_dropout_keeps_a_one_byte_mask_as_on_cuda() -> None:
    """CUDA's dropout (``native_dropout``) keeps a bool mask; the CPU's multiplies by a noise
    tensor of the input's dtype. The simulator runs CUDA's: in the forward of 8 x 4096 fp32
    activations it allocates the Linear's output and the dropout's output (131,072 B each)
    and a 32,768 B mask - no third 131,072 B tensor (the CPU's noise)."""
    import numpy as np
    import torch

    def build() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.Dropout(0.1), torch.nn.Linear(4096, 1))

    def step(model: torch.nn.Module, optimizer: object, x: torch.Tensor) -> None:
        model(x).sum().backward()

    report = simulate_module(build, step, inputs=lambda: torch.randn(8, 1024), steps=1)
    timeline = report.timeline
    forward = timeline.phases.index("forward")
    sizes = timeline.nbytes[(timeline.phase == forward) & (timeline.nbytes > 0)]
    assert int(np.count_nonzero(sizes == 8 * 4096 * 4)) == 2
    assert int(np.count_nonzero(sizes == 8 * 4096)) == 1
