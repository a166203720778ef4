"""Mixture-of-experts terms by hand: every expert resident, routed copies per token, and the
capacity factor's padding (``moe_capacity_factor``)."""

from __future__ import annotations

import pytest

from vramlens.errors import InputError
from vramlens.estimator import estimate
from vramlens.model.resolve import load_model

_WORKLOAD = {"model": "mixtral-8x7b", "batch": 1, "seq": 1024, "parallel": {"gpus": 8, "shard": "fsdp"}}


def _activations(**extra: object) -> int:
    report = estimate({**_WORKLOAD, **extra})
    return next(t.bytes for t in report.terms if t.name == "activations (saved for backward)")


def test_capacity_factor_pads_every_expert_buffer() -> None:
    """Per token and MoE layer the experts keep, for each of the k routed copies: gate and up
    outputs, the activation and the down input (4 x a x i) and the gathered input and weighted
    output (2 x a x h). A capacity factor of 1.25 pads all of them by a quarter."""
    spec = load_model("mixtral-8x7b")
    a, k = 2, spec.moe.experts_per_token  # bf16 compute under mixed precision
    per_token_layer = a * k * (4 * spec.moe.expert_intermediate_size + 2 * spec.hidden_size)
    assert per_token_layer == 262_144
    extra = 0.25 * per_token_layer * 1024 * spec.num_layers
    assert _activations(moe_capacity_factor=1.25) - _activations() == extra == 2_147_483_648


def test_dropless_is_the_default_and_factor_one_is_the_same() -> None:
    assert _activations() == _activations(moe_capacity_factor=1.0)


@pytest.mark.parametrize("value", [0.5, 0, -1])
def test_capacity_factor_below_one_is_refused(value: float) -> None:
    with pytest.raises(InputError, match=r"^moe_capacity_factor: must be a number >= 1"):
        estimate({**_WORKLOAD, "moe_capacity_factor": value})


def test_every_expert_is_resident() -> None:
    """Parameters count all 8 experts of every layer, not the 2 a token uses."""
    spec = load_model("mixtral-8x7b")
    report = estimate({**_WORKLOAD, "precision": "bf16", "parallel": {"gpus": 1}})
    params = next(t.bytes for t in report.terms if t.name == "parameters")
    assert params == spec.num_parameters * 2
    assert spec.num_parameters > 3 * spec.active_parameters
