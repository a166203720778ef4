"""A phase trace written out as one Python function (:class:`~vramlens.estimator.phase_trace.PhaseTrace`).

A trace's derived inputs, guards, phase bytes and breakdowns are integer-linear forms over its
inputs. Evaluated one closure per form (a call, an ``itemgetter`` and a ``map`` each), they cost
several times the arithmetic; :func:`compile_phases` and :func:`compile_breakdown` write the
same expressions into the source of one function each, made once per trace, with the same
operations in the same order, so every value is the one the closures give:

* a derived input is ``int(constant + c1 * v1 + c2 * v2 ...) // divisor`` (left to right);
* a form of one input is ``c * v + constant``; of more, ``constant + sum((c1 * v1, c2 * v2, ...))``
  (``sum`` over the products in order, as ``sum(map(operator.mul, ...))`` adds them) where an input
  may hold a float (``floats``: the per-token amounts), else ``constant + (c1 * v1 + c2 * v2 ...)``,
  the same integer (``sum`` of integers is their sum in any order; of floats, since Python 3.12, a
  compensated sum, which chained additions are not);
* a guard is its form compared with 0 (or, for "an input is (not) 0", the input's truth).

Only integers and the trace's own names reach the source (categories, phase names and notes are
bound as globals of the function), so nothing a workload says is executed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Form", "compile_breakdown", "compile_phases"]

Form = tuple[tuple[tuple[int, int], ...], int]
"""``sum(coefficient x input[index]) + constant``: ((index, coefficient), ...), constant."""

#: Source of each comparison of a guard's form with 0.
_OPERATORS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _product(index: int, coefficient: int) -> str:
    return f"({int(coefficient)}) * v{int(index)}"


def _form(form: Form, floats: frozenset[int]) -> str:
    """The source of a form, as the trace's evaluator computes it."""
    terms, constant = form
    if not terms:
        return f"({int(constant)})"
    if len(terms) == 1:
        ((index, coefficient),) = terms
        return f"({_product(index, coefficient)} + ({int(constant)}))"
    products = [_product(index, coefficient) for index, coefficient in terms]
    if any(index in floats for index, _ in terms):
        return f"(({int(constant)}) + sum(({', '.join(products)},)))"
    return f"(({int(constant)}) + ({' + '.join(products)}))"


def _derived(form: Form, divisor: int) -> str:
    """A derived input: ``int`` of the form summed left to right from its constant, ``//`` the divisor."""
    terms, constant = form
    summed = " + ".join([f"({int(constant)})", *(_product(index, coefficient) for index, coefficient in terms)])
    return f"int({summed}) // {int(divisor)}"


def _function(name: str, lines: Sequence[str], names: dict[str, Any]) -> Callable[..., Any]:
    namespace: dict[str, Any] = dict(names)
    # The source holds integers and the names v<N>, N<N>, T<N>, C<N> only.
    exec(compile("\n".join(lines), f"<phase trace {name}>", "exec"), namespace)
    return namespace[name]  # type: ignore[no-any-return]


def compile_phases(
    inputs: int,
    derived: Sequence[tuple[Form, int]],
    nonzero: Sequence[int],
    zero: Sequence[int],
    guards: Sequence[tuple[Form, str]],
    phases: Sequence[tuple[str, str, Form]],
    floats: frozenset[int],
) -> Callable[[Sequence[int | float]], tuple[tuple[int | float, ...], list[tuple[str, str, int]]] | None]:
    """``inputs -> (inputs and derived inputs, [(name, note, allocated bytes) per phase])``, or None
    when a guard fails: a phase trace's ``phases_of`` in one function."""
    count = inputs + len(derived)
    every = ", ".join(f"v{index}" for index in range(count))
    lines = ["def phases(inputs):", f"    {', '.join(f'v{index}' for index in range(inputs))}, = inputs"]
    lines += [f"    v{inputs + index} = {_derived(form, divisor)}" for index, (form, divisor) in enumerate(derived)]
    if nonzero:
        lines.append(f"    if not ({' and '.join(f'v{int(index)}' for index in nonzero)}):\n        return None")
    if zero:
        lines.append(f"    if {' or '.join(f'v{int(index)}' for index in zero)}:\n        return None")
    for form, check in guards:
        lines.append(f"    if not ({_form(form, floats)} {_OPERATORS[check]} 0):\n        return None")
    made = ", ".join(f"(N{index}, T{index}, {_form(form, floats)})" for index, (_, _, form) in enumerate(phases))
    lines.append(f"    return ({every},), [{made}]")
    names = {f"N{index}": name for index, (name, _, _) in enumerate(phases)}
    names.update({f"T{index}": note for index, (_, note, _) in enumerate(phases)})
    return _function("phases", lines, names)


def compile_breakdown(
    count: int, forms: Sequence[tuple[object, Form]], floats: frozenset[int]
) -> Callable[[Sequence[int | float]], dict[Any, int]]:
    """``values -> {category: bytes}`` of one phase's breakdown (``count`` values: inputs and derived)."""
    lines = ["def breakdown(values):", f"    {', '.join(f'v{index}' for index in range(count))}, = values"]
    items = ", ".join(f"C{index}: {_form(form, floats)}" for index, (_, form) in enumerate(forms))
    lines.append(f"    return {{{items}}}")
    return _function("breakdown", lines, {f"C{index}": category for index, (category, _) in enumerate(forms)})
