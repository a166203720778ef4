"""``estimator/trace_code.py``: a phase trace written out as one function gives, for any values, what
evaluating its forms one closure each gives (the closures the trace used before: ``sum`` of the
products where an input may be a float, integer arithmetic otherwise), guards included."""

from __future__ import annotations

import operator
from itertools import starmap

from hypothesis import given, settings
from hypothesis import strategies as st

from vramlens.estimator.trace_code import compile_breakdown, compile_phases

INPUTS = 5
FLOATS = frozenset({1})
_CHECKS = {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "eq": operator.eq,
    "ne": operator.ne,
}
COEFFICIENT = st.integers(-(2**40), 2**40).filter(bool)
TERMS = st.dictionaries(st.integers(0, INPUTS - 1), COEFFICIENT, max_size=4).map(lambda d: tuple(sorted(d.items())))
FORM = st.tuples(TERMS, st.integers(-(2**50), 2**50))


def _evaluate(form: tuple, values: list) -> object:
    """The closures' evaluation (phase_trace before it was written out)."""
    terms, constant = form
    if not terms:
        return constant
    if len(terms) == 1:
        ((index, coefficient),) = terms
        return coefficient * values[index] + constant
    return constant + sum(starmap(operator.mul, ((c, values[i]) for i, c in terms)))


def _reference(derived: list, plain: tuple, guards: list, phases: list, values: list) -> object:
    values = list(values)
    for (terms, constant), divisor in derived:
        total = constant
        for index, coefficient in terms:
            total += coefficient * values[index]
        values.append(int(total) // divisor)
    nonzero, zero = plain
    if not all(values[index] for index in nonzero) or any(values[index] for index in zero):
        return None
    for form, check in guards:
        if not _CHECKS[check](_evaluate(form, values), 0):
            return None
    return tuple(values), [(name, note, _evaluate(form, values)) for name, note, form in phases]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(FORM, st.integers(1, 2**21)), max_size=2),
    st.lists(st.tuples(FORM.filter(lambda f: bool(f[0])), st.sampled_from(sorted(_CHECKS))), max_size=4),
    st.lists(FORM, min_size=1, max_size=3),
    st.lists(st.one_of(st.integers(0, 2), st.integers(0, 2**45)), min_size=INPUTS, max_size=INPUTS),
    st.floats(0, 2**30, allow_nan=False),
    st.tuples(st.lists(st.integers(0, INPUTS - 1), max_size=2), st.lists(st.integers(0, INPUTS - 1), max_size=1)),
)
def test_the_written_function_is_the_closures(derived, guards, forms, values, per_token, plain) -> None:  # type: ignore[no-untyped-def]
    values[1] = per_token  # an input that may hold a float (bytes per token)
    phases = [(f"phase {i}", "", form) for i, form in enumerate(forms)]
    nonzero, zero = plain
    run = compile_phases(INPUTS, derived, nonzero=nonzero, zero=zero, guards=guards, phases=phases, floats=FLOATS)
    expected = _reference(derived, plain, guards, phases, values)
    assert run(tuple(values)) == expected
    count = INPUTS + len(derived)
    if expected is not None:
        breakdown = compile_breakdown(count, [(f"c{i}", form) for i, form in enumerate(forms)], FLOATS)
        assert breakdown(expected[0]) == {f"c{i}": _evaluate(form, list(expected[0])) for i, form in enumerate(forms)}
