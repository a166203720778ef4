"""``kernels: liger``: what a decoder layer keeps under Liger-Kernel's norms, gated MLP and RoPE, and
how the key resolves (vramlens.resolve.kernels).

Liger's Triton kernels do not run on CPU; ``liger_standins.py`` keeps for backward exactly what
Liger's autograd functions save (cited there) and patches a real transformers model as Liger's
instance patch does. The per-layer count must equal what autograd saves in that patched layer,
byte for byte, and differ from the eager count.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import requires_hf
from vramlens.errors import InputError
from vramlens.estimator import estimate
from vramlens.estimator.activations import layer_saved_parts
from vramlens.estimator.layout import lora_targets
from vramlens.estimator.recompute import layer_kind, layer_recipe, train_state
from vramlens.model.resolve import model_from_config
from vramlens.resolve.context import resolve_training
from vramlens.resolve.kernels import LIGER_PATCHES
from vramlens.workload.load import load_workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_configs import FAMILY_CONFIGS

_SEQ = 64
#: A tiny config of every family ``kernels: liger`` describes (and the layers compared).
_CASES = {
    "llama": ("llama", (1,)),
    "mistral": ("mistral-window-headdim", (1,)),
    "qwen2": ("qwen2-sliding", (1,)),
    "qwen3": ("qwen3", (1,)),
    "smollm3": ("smollm3", (2, 3)),  # RoPE and NoPE layers
    "phi3": ("phi3", (1,)),
    "gemma": ("gemma", (1,)),
}


def test_every_described_family_has_a_case() -> None:
    assert set(_CASES) == set(LIGER_PATCHES)


def _estimated(config: dict, *, precision: str, layer: int, kernels: str) -> float:
    spec = model_from_config(config, name="tiny")
    workload = load_workload(
        {"model": "llama-3.1-8b", "precision": precision, "batch": 2, "seq": _SEQ, "kernels": kernels}
    )
    ctx = resolve_training(spec, workload)
    recipe = layer_recipe(ctx, train_state(ctx, lora_targets(ctx)), [])
    return sum(part.bytes_per_token for part in layer_saved_parts(recipe, layer_kind(spec.layers[layer], _SEQ)))


@requires_hf
@pytest.mark.hf
@pytest.mark.parametrize("precision", ["bf16", pytest.param("fp32", marks=pytest.mark.slow)])
@pytest.mark.parametrize(("family", "config_name", "layer"), [(f, c, n) for f, (c, ls) in _CASES.items() for n in ls])
def test_liger_layer_matches_autograd(family: str, config_name: str, layer: int, precision: str) -> None:
    from hf_saved import layer_saved_bytes_per_token

    config = FAMILY_CONFIGS[config_name]
    dtype = {"bf16": "bfloat16", "fp32": "float32"}[precision]
    truth = layer_saved_bytes_per_token(config, dtype=dtype, attention="sdpa", seq=_SEQ, layer=layer, liger=True)
    eager = layer_saved_bytes_per_token(config, dtype=dtype, attention="sdpa", seq=_SEQ, layer=layer)
    assert _estimated(config, precision=precision, layer=layer, kernels="liger") == truth
    assert truth < eager  # the stand-ins do change what is kept


_BASE = {"model": "llama-3.1-8b", "method": "full", "recompute": "full", "batch": 8, "seq": 4096}


def test_liger_keeps_less_and_fuses_the_loss() -> None:
    eager = estimate(_BASE)
    liger = estimate({**_BASE, "kernels": "liger"})
    fused = estimate({**_BASE, "loss": "fused-linear"})
    assert liger.peak.allocated_bytes < fused.peak.allocated_bytes < eager.peak.allocated_bytes
    assert any("kernels liger" in note for note in liger.assumptions)
    # An explicit loss is the user's (Liger's fused_linear_cross_entropy turned off).
    full_loss = estimate({**_BASE, "kernels": "liger", "loss": "full"})
    assert full_loss.peak.allocated_bytes > liger.peak.allocated_bytes


def test_trl_keeps_its_own_fused_head_under_liger() -> None:
    trl = {**_BASE, "framework": "trl"}
    assert not any("kernels liger" in n for n in estimate({**trl, "kernels": "liger"}).assumptions)
    assert estimate({**trl, "kernels": "liger"}).peak.allocated_bytes < estimate(trl).peak.allocated_bytes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": "mixtral-8x7b"}, "kernels: liger is described for model types gemma, llama, "),
        ({"model": "gpt2", "seq": 512}, "gpt2 is not"),
        ({"framework": "torchtune"}, "kernels: liger patches transformers' modules; framework torchtune"),
        ({"framework": "litgpt"}, "framework litgpt builds its own"),
    ],
)
def test_what_liger_does_not_describe_is_refused_in_one_line(changes: dict, message: str) -> None:
    with pytest.raises(InputError, match=message) as caught:
        estimate({**_BASE, "kernels": "liger", **changes})
    assert "\n" not in str(caught.value)


def test_unknown_kernels_value_names_the_key() -> None:
    with pytest.raises(InputError, match="kernels: unknown value 'triton'; expected one of eager, liger"):
        estimate({**_BASE, "kernels": "triton"})


@requires_hf
def test_the_simulator_refuses_liger() -> None:
    from vramlens.simulator import SimulationError, simulate

    with pytest.raises(SimulationError, match=r"kernels: the simulator .* cannot run kernels=liger"):
        simulate({"model": "qwen2.5-0.5b", "batch": 1, "seq": 64, "kernels": "liger"})


@pytest.mark.parametrize(("precision", "method", "per_element"), [("bf16", "full", 2), ("mixed-bf16", "full", 4)])
def test_the_final_norm_keeps_its_input_and_one_statistic(precision: str, method: str, per_element: int) -> None:
    """LigerRMSNorm on the final norm: its input in the residual stream's dtype (fp32 under autocast
    with fp32 weights) and one fp32 rstd per token, where transformers' keeps an fp32 copy, the rsqrt
    and (trained) the normalized tensor, in the stream's dtype too (``weight * x.to(input_dtype)``)."""
    from vramlens.estimator.outside_layers import final_norm_per_token
    from vramlens.model.resolve import load_model

    spec = load_model("llama-3.1-8b")
    workload = {**_BASE, "precision": precision, "method": method}
    liger = resolve_training(spec, load_workload({**workload, "kernels": "liger"}))
    eager = resolve_training(spec, load_workload(workload))
    assert final_norm_per_token(liger) == per_element * 4096 + 4
    assert final_norm_per_token(eager) == 4 * 4096 + 4 + per_element * 4096
