"""Optimizer state and step temporaries (``vramlens.estimator.optimizers``) by hand.

Expected numbers, from the sources the module cites:

* torch.optim.AdamW creates ``exp_avg`` and ``exp_avg_sq`` with ``zeros_like(param)``:
  2 moments x the parameter dtype (8 B/element fp32, 4 B bf16);
* bitsandbytes 8-bit optimizers: two uint8 moments plus one fp32 absmax per 256-element
  block each: per block 2 x (256 + 4) B = 520 B, i.e. ``2 * (1 + 4/256)`` B/element;
* SGD with momentum keeps one ``momentum_buffer``; Lion one ``exp_avg``; transformers'
  Adafactor (beta1=None) keeps only row and column statistics (~0 per element);
* ``_multi_tensor_adamw`` materializes ``torch._foreach_sqrt(exp_avg_sqs)``: one
  state-sized copy of every element; ``_single_tensor_adamw`` does
  ``(exp_avg_sq.sqrt() / bias_correction2_sqrt)`` one tensor at a time: 2 copies of the
  largest tensor; the fused kernel updates in place.

The end-to-end checks use llama-3.2-1b (1,235,814,400 parameters, tied embeddings).
"""

from __future__ import annotations

import pytest

from vramlens.estimator import estimate
from vramlens.estimator.optimizers import OPTIMIZERS, in_backward_step_bytes, optimizer_model
from vramlens.model.resolve import load_model
from vramlens.workload.options import OptimizerImpl, OptimizerName

_N = OptimizerName
_I = OptimizerImpl


# ---- state bytes ---------------------------------------------------------------------------


def test_adamw_two_moments_in_the_parameter_dtype() -> None:
    adamw = OPTIMIZERS[_N.ADAMW]
    assert adamw.state_bytes(1_000_000, 4) == 1_000_000 * 2 * 4  # fp32 moments: 8 B/element
    assert adamw.state_bytes(1_000_000, 2) == 1_000_000 * 2 * 2  # bf16 params: 4 B/element


@pytest.mark.parametrize("name", [_N.ADAMW_8BIT, _N.PAGED_ADAMW_8BIT])
@pytest.mark.parametrize("param_bytes", [2, 4])
def test_eight_bit_moments_with_blockwise_absmax(name: OptimizerName, param_bytes: int) -> None:
    # 1000 blocks of 256 elements; each block: two moments of 256 uint8 + one fp32 absmax each.
    blocks = 1000
    expected = blocks * 2 * (256 * 1 + 4)  # 520,000 B, whatever the parameter dtype
    assert OPTIMIZERS[name].state_bytes(blocks * 256, param_bytes) == expected
    assert OPTIMIZERS[name].fixed_state_bytes == 2 * (1 + 4 / 256) == 2.03125


@pytest.mark.parametrize("name", [_N.SGD, _N.LION])
def test_one_moment_optimizers(name: OptimizerName) -> None:
    assert OPTIMIZERS[name].moments == 1
    assert OPTIMIZERS[name].state_bytes(1_000_000, 4) == 4_000_000
    assert OPTIMIZERS[name].state_bytes(1_000_000, 2) == 2_000_000


def test_adafactor_state_is_counted_as_zero_per_element() -> None:
    # Factored second moment: rows + cols per matrix, negligible next to rows x cols.
    assert OPTIMIZERS[_N.ADAFACTOR].state_bytes(10**9, 4) == 0


def test_paged_variants_are_flagged_and_keep_the_same_bytes() -> None:
    paged = {name for name, model in OPTIMIZERS.items() if model.paged}
    assert paged == {_N.PAGED_ADAMW, _N.PAGED_ADAMW_8BIT}
    assert OPTIMIZERS[_N.PAGED_ADAMW].state_bytes(1000, 4) == OPTIMIZERS[_N.ADAMW].state_bytes(1000, 4) == 8000
    assert OPTIMIZERS[_N.PAGED_ADAMW_8BIT].state_bytes(256, 4) == 2 * (256 + 4)


def test_registry_covers_every_optimizer_name() -> None:
    assert set(OPTIMIZERS) == set(OptimizerName)
    assert all(optimizer_model(name).name is name for name in OptimizerName)


# ---- step temporaries ------------------------------------------------------------------------


def test_adamw_step_temporaries_per_implementation() -> None:
    adamw = OPTIMIZERS[_N.ADAMW]
    elements, largest = 1_000_000, 300_000
    # foreach: _foreach_sqrt(exp_avg_sqs) is one fp32 copy of every element: 1e6 x 4 B.
    assert adamw.step_temporary_bytes(_I.FOREACH, elements, largest, 4) == 4_000_000
    # per-tensor: sqrt() and the division alive together for the largest tensor: 2 x 3e5 x 4 B.
    assert adamw.step_temporary_bytes(_I.PER_TENSOR, elements, largest, 4) == 2_400_000
    # fused: in place.
    assert adamw.step_temporary_bytes(_I.FUSED, elements, largest, 4) == 0


@pytest.mark.parametrize("impl", [_I.FOREACH, _I.PER_TENSOR, _I.FUSED])
def test_eight_bit_steps_in_place(impl: OptimizerImpl) -> None:
    # bitsandbytes' blockwise 8-bit update kernel writes the moments and parameters in place.
    assert OPTIMIZERS[_N.ADAMW_8BIT].step_temporary_bytes(impl, 10**6, 10**5, 4) == 0


def test_adafactor_step_makes_fp32_copies_of_the_largest_tensor() -> None:
    # transformers' Adafactor.step: grad**2 + eps and the factored update (2 fp32 copies), plus
    # grad.float() and p.float() for 16-bit parameters (4 in all), 4 B each, any implementation.
    # The tracked run: tests/estimator/test_optimizer_in_backward.py.
    for impl in (_I.FOREACH, _I.PER_TENSOR, _I.FUSED):
        assert OPTIMIZERS[_N.ADAFACTOR].step_temporary_bytes(impl, 10**6, 10**5, 2) == 4 * 4 * 10**5
        assert OPTIMIZERS[_N.ADAFACTOR].step_temporary_bytes(impl, 10**6, 10**5, 4) == 2 * 4 * 10**5


def test_in_backward_step_is_one_tensor_and_its_gradient() -> None:
    # A foreach step over a one-tensor list copies that tensor once, per-tensor twice, fused never.
    adamw = OPTIMIZERS[_N.ADAMW]
    assert in_backward_step_bytes(adamw, _I.FOREACH, 1000, 2, 2) == 1000 * 2 + 1000 * 2
    assert in_backward_step_bytes(adamw, _I.PER_TENSOR, 1000, 2, 2) == 1000 * 2 + 2 * 1000 * 2
    assert in_backward_step_bytes(adamw, _I.FUSED, 1000, 2, 2) == 1000 * 2
    assert in_backward_step_bytes(OPTIMIZERS[_N.ADAFACTOR], _I.FUSED, 1000, 2, 2) == 1000 * 2 + 4 * 4 * 1000


@pytest.mark.parametrize("name", [_N.SGD, _N.PAGED_ADAMW])
def test_in_place_optimizers_have_no_per_tensor_temporaries(name: OptimizerName) -> None:
    model = OPTIMIZERS[name]
    assert model.step_temporary_bytes(_I.FOREACH, 10**6, 10**5, 4) == 0
    assert model.step_temporary_bytes(_I.PER_TENSOR, 10**6, 10**5, 4) == 0


# ---- end to end: llama-3.2-1b, full fine-tune, fp32 ------------------------------------------


def _terms(optimizer: str, impl: str = "fused") -> dict[str, int]:
    workload = {
        "model": "llama-3.2-1b",
        "method": "full",
        "precision": "fp32",
        "optimizer": optimizer,
        "optimizer_impl": impl,
        "batch": 1,
        "seq": 128,
    }
    return {term.name: term.bytes for term in estimate(workload).terms}


def _n() -> int:
    return load_model("llama-3.2-1b").num_parameters


def test_end_to_end_adamw_state() -> None:
    assert _n() == 1_235_814_400
    # Two fp32 moments per parameter: 8 B x 1,235,814,400 = 9,886,515,200 B.
    assert _terms("adamw")["optimizer state (model)"] == _n() * 8 == 9_886_515_200


def test_end_to_end_adamw_8bit_state() -> None:
    """Per tensor (estimator/paged.py): the tied 128256 x 2048 embedding keeps two fp32 moments
    (HF Trainer's ``optim_bits: 32`` override for ``nn.Embedding``), the 33 RMSNorm weights of 2048
    elements are under bnb's ``min_8bit_size`` (4096: fp32 moments), every linear has 2 B of moments
    per element + 2 fp32 absmax (8 B) per 256 elements (each a multiple of 256)."""
    n, embedding, norms = _n(), 128256 * 2048, 33 * 2048
    linears = n - embedding - norms  # 972,078,528
    expected = 2 * linears + 8 * (linears // 256) + 8 * embedding + 8 * norms  # 4,115,364,480 B
    assert _terms("adamw-8bit")["optimizer state (model; bitsandbytes, per tensor)"] == expected


def test_end_to_end_sgd_state() -> None:
    assert _terms("sgd")["optimizer state (model)"] == _n() * 4  # one fp32 momentum buffer


def test_end_to_end_foreach_minus_fused_temporaries() -> None:
    def temporaries(impl: str) -> int:
        return sum(v for k, v in _terms("adamw", impl).items() if k.startswith("optimizer step temporaries"))

    # foreach: one fp32 copy of all n elements; fused: nothing.
    assert temporaries("foreach") - temporaries("fused") == _n() * 4
    assert temporaries("fused") == 0


def test_end_to_end_foreach_raises_the_optimizer_step_phase_by_the_copy() -> None:
    def step_phase(impl: str) -> int:
        workload = {"model": "llama-3.2-1b", "precision": "fp32", "optimizer_impl": impl, "batch": 1, "seq": 128}
        return next(p.allocated_bytes for p in estimate(workload).phases if p.name == "optimizer_step")

    assert step_phase("foreach") - step_phase("fused") == _n() * 4
