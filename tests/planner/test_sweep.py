"""``vramlens.planner.sweep``: values read as workload files read them, growth orders, the fit marker
against ``max_batch``, two-axis grids, and one-line errors."""

from __future__ import annotations

import itertools

import pytest

from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.estimator import estimate
from vramlens.estimator.capacity import max_batch
from vramlens.planner.sweep import parse_axis, sweep

MODEL = "llama-3.2-1b"
BASE = {"model": MODEL, "gpu": "a100-80gb"}


def _bytes(result: object, category: Category) -> list[int]:
    return [row.stack.get(category, 0) for row in result.rows]  # type: ignore[attr-defined]


def _growth(result: object, axis: str, quantity: str) -> object:
    return next(g for g in result.growth if g.axis == axis and g.quantity == quantity)  # type: ignore[attr-defined]


def test_batch_sweep_activations_grow_linearly_and_parameters_stay() -> None:
    # Every saved activation has a leading batch dimension (batch x seq x hidden, ...), so with
    # batch 1..6 (equal steps) each step adds the same bytes: constant first differences, and
    # the fitted order is 1. Weights do not depend on the batch: the same bytes in every row.
    result = sweep(BASE, {"batch": [1, 2, 3, 4, 5, 6]})
    activations = _bytes(result, Category.ACTIVATIONS)
    steps = [b - a for a, b in itertools.pairwise(activations)]
    assert steps[0] > 0 and all(step == steps[0] for step in steps), steps
    assert activations[0] * 6 == activations[-1]  # proportional: no batch-independent part
    assert len(set(_bytes(result, Category.PARAMETERS))) == 1
    growth = _growth(result, "batch", "activations")
    assert growth.shape == "linear" and growth.order == pytest.approx(1.0, abs=0.01)  # type: ignore[attr-defined]
    assert _growth(result, "batch", "parameters").shape == "constant"  # type: ignore[attr-defined]
    # doubling 1 -> 2 doubles the activations: the consecutive ratio is 2
    assert growth.ratios[0] == pytest.approx(2.0)  # type: ignore[attr-defined]


def test_largest_fitting_batch_is_max_batch() -> None:
    # capacity.max_batch searches the same estimator for the largest batch that fits; a sweep
    # over every batch from 1 to beyond it must stop fitting exactly there.
    limit = max_batch(BASE)
    assert 1 <= limit < 30  # llama-3.2-1b, seq 2048, mixed bf16 AdamW: a few samples per 80 GB
    result = sweep(BASE, {"batch": list(range(1, limit + 4))})
    assert result.largest_fitting == limit
    assert [row.fits for row in result.rows] == [b <= limit for b in range(1, limit + 4)]
    at_limit = estimate(BASE, batch=limit)
    assert result.rows[limit - 1].report is not None
    assert result.rows[limit - 1].report.device_bytes == at_limit.device_bytes


def test_stack_adds_up_to_the_device_peak() -> None:
    result = sweep(BASE, {"batch": [1, 4]})
    for row in result.rows:
        assert row.report is not None and sum(row.stack.values()) == row.report.device_bytes


def test_eager_attention_grows_superlinearly_in_seq_and_flash_linearly() -> None:
    # Eager attention saves the softmax scores (batch x heads x seq x seq per layer): activations
    # are a*seq + b*seq**2, so the fitted order lies above 1 (towards 2 at long seq). Flash
    # attention saves no scores: activations are proportional to seq (order 1). "2k" = 2048.
    # The bytes are those at the peak, so every row must peak in the same phase (backward);
    # below ~2k tokens this model peaks elsewhere and the activations live there are not comparable.
    values = ["2k", "4k", "8k", "16k"]
    eager = sweep({**BASE, "attention": "eager", "batch": 1}, {"seq": values})
    assert eager.axes[0].values == (2048, 4096, 8192, 16384)
    assert {row.report.peak_phase for row in eager.rows if row.report is not None} == {"backward"}
    growth = _growth(eager, "seq", "activations")
    assert growth.shape in ("superlinear", "quadratic") and growth.order > 1.3  # type: ignore[attr-defined]
    flash = sweep({**BASE, "attention": "flash", "batch": 1}, {"seq": values})
    assert _growth(flash, "seq", "activations").shape == "linear"  # type: ignore[attr-defined]


def test_two_axes_give_every_pair_second_fastest() -> None:
    result = sweep(BASE, {"batch": [1, 2], "seq": ["512", "1k", "2k"]})
    assert [a.key for a in result.axes] == ["batch", "seq"]
    assert [dict(r.values) for r in result.rows] == [{"batch": b, "seq": s} for b in (1, 2) for s in (512, 1024, 2048)]
    assert {g.axis for g in result.growth} == {"batch", "seq"}
    assert result.largest_fitting is None  # only defined for one axis
    data = result.to_dict()
    assert set(data["growth"]) == {"batch", "seq"} and len(data["rows"]) == 6


def test_nested_keys_and_refused_combinations_become_row_errors() -> None:
    # tp=2 on 1 GPU breaks the contract's gpus = multiple of tp*pp*cp: that row says why, the
    # sweep goes on.
    result = sweep(BASE, {"tp": [1, 2]})
    assert result.axes[0].key == "parallel.tp"
    first, second = result.rows
    assert first.report is not None and first.error is None
    assert second.report is None and second.error is not None and "parallel.gpus" in second.error
    assert "\n" not in second.error and not second.fits


@pytest.mark.parametrize(
    ("axes", "expected"),
    [
        ({"tpp": [1]}, "tpp: unknown workload key"),
        ({"batch": ["x"]}, "batch: must be an integer"),
        ({"seq": ["2q"]}, "seq: must be an integer >= 1 (or e.g. '8k' = 8192)"),
        ({"batch": [1, 1]}, "batch: values repeat"),
        ({}, "sweep: give one or two"),
        ({"batch": [1], "seq": [1], "tp": [1]}, "sweep: give one or two"),
    ],
)
def test_bad_keys_and_values_are_one_line_errors(axes: dict[str, list[object]], expected: str) -> None:
    with pytest.raises(InputError) as error:
        sweep(BASE, axes)
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_parse_axis_names_the_flag() -> None:
    with pytest.raises(InputError, match=r"^--batch: must be an integer"):
        parse_axis("batch", ["0"], name="--batch")
    assert parse_axis("precision", ["bf16", "fp32"]).values == ("bf16", "fp32")
