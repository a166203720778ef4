"""An estimate's phases as numbers: the phases' own code run once on traced sizes, then re-evaluated.

:func:`vramlens.estimator.step_phases.training_phases` builds a step's instants term by term. For
one stage plan its control flow depends on the sizes only through a few comparisons (is the loss
higher than a layer's forward, is a quantity zero, which backward instant is highest), and each
phase's bytes are sums of the stage's quantities. :func:`trace_phases` runs it once with every
sized quantity (:data:`~vramlens.estimator.stage_memory.SIZED_QUANTITIES`, the logits' too) a
:class:`Traced` integer: arithmetic records an exact integer-linear form over them (``//`` by a
constant a derived input), and every comparison or truth test records what it found (a guard).
:meth:`PhaseTrace.phases_of` gives another workload's phase bytes and breakdowns by evaluating those
forms (written out as one function per trace: :mod:`vramlens.estimator.trace_code`), or None when
a guard no longer holds (the caller then runs the code itself). Anything else done with a traced value (hashing, conversion, division by a variable, formatting) raises
:class:`Untraceable` and no trace is made.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import NoReturn

from vramlens.categories import Category
from vramlens.estimator.size_symbols import merged_terms
from vramlens.estimator.stage_memory import SIZED_QUANTITIES, StageMemory
from vramlens.estimator.step_phases import training_phases
from vramlens.estimator.trace_code import Form, compile_breakdown, compile_phases
from vramlens.resolve.context import TrainingContext
from vramlens.result.report import Term

__all__ = ["PhaseTrace", "Traced", "Untraceable", "trace_phases"]

_SCALARS = tuple(name for name in SIZED_QUANTITIES if name != "logits")
_LOGITS = ("forward_end", "kept", "backward_start", "outputs")
#: The inputs that may hold a float (bytes per token); every other input is a number of bytes (an integer).
_FLOATS = frozenset(
    index for index, name in enumerate(_SCALARS) if name in ("masks_bytes_per_token", "mixer_backward_bytes_per_token")
)
#: What each guard asserts of its form's value.
_CHECKS: dict[str, Callable[[int | float, int], bool]] = {
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq, "ne": operator.ne,
}  # fmt: skip
_NEGATION = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}


class Untraceable(Exception):
    """A traced value was used in a way a trace cannot replay."""


class _Recorder:
    """The inputs, derived inputs and guards of one traced run."""

    def __init__(self, inputs: int) -> None:
        self.inputs = inputs
        self.derived: list[tuple[Form, int]] = []
        self.guards: dict[tuple[Form, str], None] = {}


class Traced:
    """An integer known as an exact linear form over a trace's inputs, and its value in the traced run."""

    __slots__ = ("constant", "recorder", "terms", "value")

    def __init__(self, recorder: _Recorder, terms: tuple[tuple[int, int], ...], constant: int, value: int) -> None:
        self.recorder, self.terms, self.constant, self.value = recorder, terms, constant, value

    def _combine(self, other: object, sign: int) -> Traced:
        if isinstance(other, Traced):
            terms = merged_terms(self.terms, other.terms, sign)
            return Traced(self.recorder, terms, self.constant + sign * other.constant, self.value + sign * other.value)
        if isinstance(other, int):
            return Traced(self.recorder, self.terms, self.constant + sign * other, self.value + sign * other)
        raise Untraceable(f"a traced value combined with {type(other).__name__}")

    def __add__(self, other: object) -> Traced:
        return self._combine(other, 1)

    __radd__ = __add__

    def __sub__(self, other: object) -> Traced:
        return self._combine(other, -1)

    def __rsub__(self, other: object) -> Traced:
        return (-self)._combine(other, 1)

    def __neg__(self) -> Traced:
        return Traced(self.recorder, tuple((i, -c) for i, c in self.terms), -self.constant, -self.value)

    def __mul__(self, factor: object) -> Traced:
        if not isinstance(factor, int):
            raise Untraceable(f"a traced value multiplied by {type(factor).__name__}")
        terms = tuple((i, c * factor) for i, c in self.terms) if factor else ()
        return Traced(self.recorder, terms, self.constant * factor, self.value * factor)

    __rmul__ = __mul__

    def __floordiv__(self, divisor: object) -> Traced:
        if not isinstance(divisor, int) or divisor <= 0:
            raise Untraceable(f"a traced value divided by {divisor!r}")
        recorder = self.recorder
        index = recorder.inputs + len(recorder.derived)
        recorder.derived.append(((self.terms, self.constant), divisor))
        return Traced(recorder, ((index, 1),), 0, self.value // divisor)

    def _compare(self, other: object, check: str) -> bool:
        difference = self._combine(other, -1)
        found = _CHECKS[check](difference.value, 0)
        if difference.terms:
            held = check if found else _NEGATION[check]
            self.recorder.guards[(difference.terms, difference.constant), held] = None
        return found

    def __lt__(self, other: object) -> bool:
        return self._compare(other, "lt")

    def __le__(self, other: object) -> bool:
        return self._compare(other, "le")

    def __gt__(self, other: object) -> bool:
        return self._compare(other, "gt")

    def __ge__(self, other: object) -> bool:
        return self._compare(other, "ge")

    def __eq__(self, other: object) -> bool:
        return self._compare(other, "eq")

    def __ne__(self, other: object) -> bool:
        return self._compare(other, "ne")

    def __bool__(self) -> bool:
        return self._compare(0, "ne")

    def _refuse(self, *_: object) -> NoReturn:
        raise Untraceable("a traced value hashed, converted, divided or formatted")

    __hash__ = __index__ = __int__ = __float__ = __format__ = __truediv__ = __rtruediv__ = __mod__ = _refuse


class _Part(list[Term]):
    """A sized quantity's terms in a traced run: one term of its traced bytes (the quantity's
    terms share one category), present when the bytes are not 0 (a guard)."""

    def __init__(self, bytes_: Traced, category: Category | None) -> None:
        super().__init__([_term(bytes_, category)])
        self.bytes = bytes_

    def __bool__(self) -> bool:
        return bool(self.bytes)


def _term(bytes_: Traced, category: Category | None) -> Term:
    term = object.__new__(Term)
    for name, value in (("name", ""), ("category", category), ("bytes", bytes_), ("explain", ""), ("alive", "")):
        object.__setattr__(term, name, value)
    return term


class PhaseTrace:
    """The phases of one stage plan as forms over its sized quantities (see the module docstring)."""

    __slots__ = ("breakdowns", "read", "run")

    def __init__(self, recorder: _Recorder, phases: list[tuple[str, str, Form, tuple[tuple[Category, Form], ...]]]):
        self.read = attrgetter(*_SCALARS, *(f"logits.{name}" for name in _LOGITS))
        guards = [((terms, constant), held) for (terms, constant), held in recorder.guards]
        plain = [(terms[0][0], held) for (terms, constant), held in guards if _plain(terms, constant, held)]
        self.run = compile_phases(
            recorder.inputs,
            recorder.derived,
            nonzero=[index for index, held in plain if held == "ne"],
            zero=[index for index, held in plain if held == "eq"],
            guards=[(form, held) for form, held in guards if not _plain(*form, held)],
            phases=[(name, note, allocated) for name, note, allocated, _ in phases],
            floats=_FLOATS,
        )
        """``inputs -> (values, phases)``, or None where a guard fails (:mod:`~vramlens.estimator.trace_code`)."""
        count = recorder.inputs + len(recorder.derived)
        self.breakdowns = tuple(compile_breakdown(count, forms, _FLOATS) for _, _, _, forms in phases)
        """Each phase's breakdown: ``values -> {category: bytes}`` in the order the categories first appear."""

    def phases_of(self, mem: StageMemory) -> tuple[Sequence[int | float], list[tuple[str, str, int]]] | None:
        """The trace's values for ``mem``'s sized quantities and each phase's (name, note, allocated
        bytes); None when the run would take another path."""
        return self.run(self.read(mem) if mem.logits is not None else self._no_logits(mem))

    def breakdown(self, phase: int, values: Sequence[int | float]) -> dict[Category, int]:
        """Phase ``phase``'s bytes by category, for the ``values`` of :meth:`phases_of`."""
        return self.breakdowns[phase](values)

    def _no_logits(self, mem: StageMemory) -> tuple[int | float, ...]:
        return (*[getattr(mem, name) for name in _SCALARS], 0, 0, 0, 0)


def _plain(terms: tuple[tuple[int, int], ...], constant: int, held: str) -> bool:
    """A guard that an input is (not) 0: checked by the input's truth."""
    return len(terms) == 1 and terms[0][1] == 1 and constant == 0 and held in ("ne", "eq")


def trace_phases(ctx: TrainingContext, mem: StageMemory) -> PhaseTrace | None:
    """The :class:`PhaseTrace` of ``mem``'s stage plan, traced at ``mem``'s sizes (a memory with its
    terms, from :func:`~vramlens.estimator.quantities.stage_memory`); None if it cannot be traced."""
    recorder = _Recorder(len(_SCALARS) + len(_LOGITS))
    probe = copy.copy(mem)
    for index, name in enumerate(_SCALARS):
        value = getattr(mem, name)
        setattr(probe, name, _input(recorder, index, value) if isinstance(value, int) else _REFUSED)
    if mem.logits is not None:
        fields = {
            name: _input(recorder, len(_SCALARS) + i, getattr(mem.logits, name)) for i, name in enumerate(_LOGITS)
        }
        probe.logits = dataclasses.replace(mem.logits, **fields)  # type: ignore[arg-type]
    probe.parts = dict(mem.parts)
    for name in ("activations_bytes", "inputs_bytes", "non_layer_bytes", "head_side_bytes"):
        categories = {term.category for term in mem.parts.get(name, ())}
        if len(categories) > 1:
            return None
        probe.parts[name] = _Part(getattr(probe, name), next(iter(categories), None))
    try:
        phases = [
            (phase.name, phase.note, _form(phase.allocated_bytes), _forms(phase.breakdown))
            for phase in training_phases(ctx, probe)
        ]
    except Untraceable:
        return None
    return PhaseTrace(recorder, phases)


class _Refused:
    """A sized quantity that is not an integer (bytes per token): a trace cannot use it."""

    def __getattr__(self, name: str) -> NoReturn:
        raise Untraceable(f"read .{name} of a per-token amount")

    def _refuse(self, *_: object) -> NoReturn:
        raise Untraceable("used a per-token amount")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __floordiv__ = _refuse
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = __bool__ = __hash__ = __float__ = __int__ = _refuse
    __format__ = __neg__ = _refuse


_REFUSED = _Refused()


def _input(recorder: _Recorder, index: int, value: int) -> Traced:
    return Traced(recorder, ((index, 1),), 0, value)


def _form(value: object) -> Form:
    if isinstance(value, Traced):
        return value.terms, value.constant
    if isinstance(value, int):
        return (), value
    raise Untraceable(f"a phase's bytes are {type(value).__name__}")


def _forms(breakdown: object) -> tuple[tuple[Category, Form], ...]:
    return tuple((category, _form(value)) for category, value in breakdown.items())  # type: ignore[attr-defined]
