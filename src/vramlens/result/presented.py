"""Estimate reports whose terms, allocator terms and assumptions are made when first read.

:meth:`vramlens.result.report.MemoryReport.presented_later` gives a :class:`MemoryReport` of the
figures a fast estimate computed (:mod:`vramlens.estimator.fast_estimate`): its terms, formulas and
notes, which a planner's sweep never reads, come from a report of the same workload made term by
term when one of them is first read, and that report's figures are checked to be the same. Its
phases (:func:`terms_later`) likewise make their terms and breakdown when first read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from vramlens.categories import Category
from vramlens.result.report import MemoryReport, PhaseMemory, Term, terms_bytes

__all__ = ["presented_later", "terms_later"]

T = TypeVar("T")
U = TypeVar("U")


class _TermsLater(PhaseMemory):
    """A :class:`PhaseMemory` whose terms and breakdown are made when first read
    (:func:`terms_later`); otherwise the same frozen dataclass (fields, equality, ``replace``)."""

    __slots__ = ("_make", "_make_arg", "_sums", "_sums_arg")


def _made_later(name: str, pending: str, check: Callable[[PhaseMemory, Any], Any]) -> property:
    """The field ``name`` of a :class:`_TermsLater`, made by its ``pending`` function of its
    ``pending + "_arg"`` when first read (and checked by ``check``); what a dataclass ``__init__`` or
    ``replace`` sets is kept as it is."""
    slot = PhaseMemory.__dict__[name]
    argument = f"{pending}_arg"

    def read(phase: PhaseMemory) -> Any:
        make = getattr(phase, pending, None)
        if make is not None:
            slot.__set__(phase, check(phase, make(getattr(phase, argument))))
            object.__setattr__(phase, pending, None)
            object.__setattr__(phase, argument, None)
        return slot.__get__(phase, PhaseMemory)

    def write(phase: PhaseMemory, value: Any) -> None:
        slot.__set__(phase, value)
        object.__setattr__(phase, pending, None)
        object.__setattr__(phase, argument, None)

    return property(read, write)


def _kept(phase: PhaseMemory, made: list[Term]) -> tuple[Term, ...]:
    kept = tuple(term for term in made if term.bytes)
    if len(kept) != len(made) or terms_bytes(kept) != phase.allocated_bytes:
        raise ValueError(f"phase {phase.name}: terms add up to {terms_bytes(kept)}, not {phase.allocated_bytes}")
    return kept


def _summed(phase: PhaseMemory, made: Mapping[Category, int]) -> Mapping[Category, int]:
    if sum(made.values()) != phase.allocated_bytes:
        raise ValueError(f"phase {phase.name}: breakdown adds up to {sum(made.values())}, not {phase.allocated_bytes}")
    return made


_TermsLater.terms = _made_later("terms", "_make", _kept)  # type: ignore[assignment]
_TermsLater.breakdown = _made_later("breakdown", "_sums", _summed)  # type: ignore[assignment]
_NAME, _ALLOCATED, _NOTE = (PhaseMemory.__dict__[name].__set__ for name in ("name", "allocated_bytes", "note"))
_MAKE, _MAKE_ARG, _SUMS, _SUMS_ARG = (
    _TermsLater.__dict__[name].__set__ for name in ("_make", "_make_arg", "_sums", "_sums_arg")
)


def terms_later(
    name: str,
    allocated_bytes: int,
    note: str,
    breakdown: Callable[[T], Mapping[Category, int]],
    breakdown_of: T,
    terms: Callable[[U], list[Term]],
    terms_of: U,
) -> PhaseMemory:
    """The phase whose high point is the terms ``terms(terms_of)`` makes, ``breakdown(breakdown_of)``
    their bytes by category (none 0): both made when first read. ``allocated_bytes`` is their sum
    (checked when they are made; none is 0)."""
    phase = object.__new__(_TermsLater)
    _NAME(phase, name)
    _ALLOCATED(phase, allocated_bytes)
    _NOTE(phase, note)
    _MAKE(phase, terms)
    _MAKE_ARG(phase, terms_of)
    _SUMS(phase, breakdown)
    _SUMS_ARG(phase, breakdown_of)
    return phase


def presented_later(present: Callable[[], MemoryReport], fields: dict[str, Any]) -> MemoryReport:
    """A report of ``fields`` whose terms, allocator terms and assumptions are those of ``present()``
    (see the module docstring)."""
    report = object.__new__(_PresentedLater)
    vars(report).update(fields, _present=present)
    return report


#: What a :class:`_PresentedLater` report makes when first read.
_LATER = ("terms", "allocator_terms", "assumptions")
#: The figures it checks against the report made term by term.
_FIGURES = (
    "engine", "model", "workload", "peak_phase", "allocated_bytes", "reserved_bytes", "device_bytes", "gpu",
    "capacity_bytes", "runtime", "runtime_terms", "serving", "device_known", "safe",
)  # fmt: skip


class _PresentedLater(MemoryReport):
    """A :class:`MemoryReport` whose terms, allocator terms and assumptions are made when first read
    (:meth:`MemoryReport.presented_later`); otherwise the same frozen dataclass."""

    def presented(self) -> MemoryReport:
        """The report made term by term, checked to have this one's figures."""
        found: MemoryReport | None = vars(self).get("_presented")
        if found is None:
            found = vars(self)["_present"]()
            _check_same(self, found)
            vars(self)["_presented"] = found
        return found


def _later(name: str) -> property:
    def read(report: _PresentedLater) -> Any:
        if name not in vars(report):
            vars(report)[name] = getattr(report.presented(), name)
        return vars(report)[name]

    def write(report: _PresentedLater, value: Any) -> None:  # what a dataclass __init__ sets (replace)
        vars(report)[name] = value

    return property(read, write)


for _name in _LATER:
    setattr(_PresentedLater, _name, _later(_name))


def _check_same(fast: MemoryReport, made: MemoryReport) -> None:
    """Refuse a report made term by term whose figures are not ``fast``'s (an internal error)."""
    ours = [getattr(fast, name) for name in _FIGURES]
    theirs = [getattr(made, name) for name in _FIGURES]
    ours += [(p.name, p.allocated_bytes, p.note, tuple(p.breakdown.items())) for p in fast.phases]
    theirs += [(p.name, p.allocated_bytes, p.note, tuple(p.breakdown.items())) for p in made.phases]
    if ours != theirs:
        raise AssertionError(f"{fast.model}: the estimate's figures differ from its terms' ({fast.workload!r})")
