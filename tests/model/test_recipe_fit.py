"""Recipe fits (``model/generic/recipe.py``): exact at their sizes, right on any polynomial of
the form they assume, and their JSON round trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramlens.model.generic.recipe import (
    Fit,
    InferenceKind,
    InferenceRecipe,
    TrainingKind,
    TrainingRecipe,
    check_size,
    fit_sizes,
    recipe_from_json,
    recipe_to_json,
    solve_fit,
)

coefficient = st.integers(min_value=0, max_value=10**6)


@given(
    constant=coefficient,
    shared=coefficient,
    c0=coefficient,
    c1=coefficient,
    c2=st.integers(min_value=0, max_value=1000),
    seq=st.integers(min_value=8, max_value=1 << 17),
)
def test_a_polynomial_of_the_assumed_form_is_recovered_everywhere(
    constant: int, shared: int, c0: int, c1: int, c2: int, seq: int
) -> None:
    def truth(b: int, s: int) -> int:
        return constant + shared * s + b * (c0 + c1 * s + c2 * s * s)

    fit = solve_fit(seq, tuple(truth(b, s) for b, s in fit_sizes(seq)))
    for b, s in (*fit_sizes(seq), check_size(seq), (7, seq // 3 + 1), (1, 2 * seq)):
        assert abs(fit.at(b, s) - truth(b, s)) <= 1e-6 * truth(b, s) + 2


def test_a_fit_is_exact_at_its_own_sizes_even_when_the_bytes_are_not_polynomial() -> None:
    padded = [max(64, -(-s // 64) * 64) * 1000 * b + 5 for b, s in fit_sizes(100)]  # chunk-padded lengths
    fit = solve_fit(100, tuple(padded))
    assert [fit.at(b, s) for b, s in fit_sizes(100)] == padded


def test_tiny_lengths_lower_the_degree() -> None:
    fit = solve_fit(1, (17, 17, 17, 24, 24))
    assert (fit.constant, fit.per_sequence, fit.per_token, fit.per_token2) == (3.0, 7.0, 0.0, 0.0)
    assert fit.at(4, 1) == 3 + 4 * 7


def test_one_sequence_is_measured_on_its_own_when_the_code_keeps_other_tensors() -> None:
    values = tuple(1000 * b * s for b, s in fit_sizes(64))
    assert solve_fit(64, values, batch_one=64_000).batch_one is None  # on the line: nothing to keep
    fit = solve_fit(64, values, batch_one=90_000)  # a fused buffer kept whole for one sequence only
    assert (fit.at(1, 64), fit.at(2, 64), fit.at(1, 32)) == (90_000, 128_000, 32_000)


def test_a_fit_never_reports_negative_bytes() -> None:
    assert Fit(constant=-10.0, shared_per_token=0.0, per_sequence=0.0, per_token=0.0, per_token2=0.0).at(1, 1) == 0


def _fit(x: float) -> Fit:
    return Fit(
        constant=x, shared_per_token=x + 1, per_sequence=x + 2, per_token=x + 3, per_token2=x + 4, seq=64, batch_one=9
    )


@pytest.mark.parametrize(
    "recipe",
    [
        TrainingRecipe(
            seq=512,
            interpolates=True,
            kinds=(
                TrainingKind(
                    end_of_forward=_fit(1),
                    start_of_backward=_fit(2),
                    forward_transient=_fit(3),
                    backward_working=_fit(4),
                    trainable=11,
                    frozen_bytes=12,
                ),
            ),
            outside_forward=_fit(5),
            outside_backward=_fit(6),
            head_constant=7,
            trainable_outside=8,
            frozen_outside_bytes=9,
            notes=("a",),
        ),
        InferenceRecipe(
            prompt=64,
            context=96,
            interpolates=False,
            kinds=(
                InferenceKind(
                    prefill_cache=_fit(1),
                    prefill_working=_fit(2),
                    decode_cache=_fit(3),
                    decode_working=_fit(4),
                    weight_bytes=5,
                ),
            ),
            head_prefill=_fit(6),
            head_decode=_fit(7),
            weight_outside_bytes=8,
        ),
    ],
)
def test_recipes_survive_their_json(recipe: TrainingRecipe | InferenceRecipe) -> None:
    import json

    assert recipe_from_json(json.loads(json.dumps(recipe_to_json(recipe)))) == recipe


def test_a_bad_recipe_document_is_a_plain_error() -> None:
    with pytest.raises((KeyError, ValueError, TypeError)):
        recipe_from_json({"type": "Spaceship"})
