"""One instant of a training step: the terms alive then (whole quantities' terms and the
instant's own amounts), and the base every instant starts from (parameters, optimizer state, the
cuBLAS workspace). Used by :mod:`vramlens.estimator.step_phases`."""

from __future__ import annotations

from typing import cast

from vramlens.categories import Category
from vramlens.estimator.runtime import CUBLAS_FORMULA, CUBLAS_WORKSPACE_BYTES
from vramlens.estimator.stage_memory import Formula, StageMemory, Summed
from vramlens.result.report import PhaseMemory, Term

__all__ = ["Instant", "base_instant"]

_C = Category


#: An instant's own amount, its Term made only if the instant is reported: (name, category, bytes, formula).
_Own = tuple[str, Category, int, Formula]
#: ``StageMemory.derived`` keys (size-free records, shared by the estimates of one stage plan).
_BASE = "phases: base"


class Instant:
    """The terms alive at one instant of a step: whole quantities (their terms) and the
    instant's own amounts, named with their formula. Its total is kept as they are added (to pick
    the highest instant); its terms are made for a phase (:meth:`phase`)."""

    __slots__ = ("alive", "mem", "pieces", "total_bytes")

    def __init__(self, mem: StageMemory, alive: str, pieces: tuple[Summed | list[Term], ...] = (), total: int = 0):
        self.mem, self.alive = mem, alive
        self.pieces: list[Summed | list[Term] | _Own] = list(pieces)
        self.total_bytes = total

    def part(self, quantity: Summed) -> None:
        """Every term of ``quantity`` (alive at this instant in full; they add up to the quantity)."""
        if self.mem.parts.get(quantity):
            self.pieces.append(quantity)
            self.total_bytes += getattr(self.mem, quantity)

    def parts(self, *quantities: Summed) -> None:
        """Every term of each of ``quantities``, in order (see :meth:`part`)."""
        mem, pieces = self.mem, self.pieces
        for quantity in quantities:
            if mem.parts.get(quantity):
                pieces.append(quantity)
                self.total_bytes += getattr(mem, quantity)

    def add(self, name: str, category: Category, value: int, formula: Formula) -> None:
        """A term of ``value`` bytes alive at this instant (none when 0)."""
        if value:
            self.pieces.append((name, category, value, formula))
            self.total_bytes += value

    def quantity(self, name: str, category: Category, key: str) -> None:
        """The instant's share of a quantity with no term of its own (``StageMemory.formulas[key]``)."""
        value = getattr(self.mem, key)
        if value:
            self.add(name, category, value, self.mem.formulas.get(key, ""))

    def terms(self) -> list[Term]:
        """The instant's terms, in the order they were added."""
        found: list[Term] = []
        alive, parts = self.alive, self.mem.parts
        for piece in self.pieces:
            if isinstance(piece, str):
                found.extend(parts[piece])
            elif isinstance(piece, list):
                found.extend(piece)
            else:
                name, category, value, formula = piece
                found.append(Term(name=name, category=category, bytes=value, explain=formula, alive=alive))
        return found

    def phase(self, name: str, note: str) -> PhaseMemory:
        """This instant as the phase ``name``."""
        return PhaseMemory.of_terms(name, note, self.terms())


#: The cuBLAS workspaces' terms (the same at every instant of a steady step): the main thread's, and
#: the autograd engine's device thread's, made by the first backward's first matmul (one workspace
#: per cuBLAS handle and stream, handles per thread: CublasHandlePool.cpp; :mod:`vramlens.simulator._blas`).
_CUBLAS = [
    Term(
        name="cuBLAS workspace (from the caching allocator)",
        category=_C.OTHER,
        bytes=CUBLAS_WORKSPACE_BYTES,
        explain=CUBLAS_FORMULA,
        alive="from the first matmul on",
    ),
    Term(
        name="cuBLAS workspace of the autograd thread (from the caching allocator)",
        category=_C.OTHER,
        bytes=CUBLAS_WORKSPACE_BYTES,
        explain=f"{CUBLAS_FORMULA}; backward runs on the autograd engine's device thread, with its own handle",
        alive="from the first backward's first matmul on",
    ),
]


def base_instant(mem: StageMemory, alive: str) -> Instant:
    """Parameters, optimizer state and the cuBLAS workspace: alive at every instant (the same for
    every estimate of a stage plan)."""
    known = cast("tuple[tuple[Summed | list[Term], ...], int] | None", mem.derived.get(_BASE))
    if known is None:
        instant = Instant(mem, alive)
        instant.parts("params_bytes", "states_bytes")
        instant.pieces.append(_CUBLAS)
        instant.total_bytes += sum(term.bytes for term in _CUBLAS)
        known = (cast("tuple[Summed | list[Term], ...]", tuple(instant.pieces)), instant.total_bytes)
        mem.derived[_BASE] = known
    return Instant(mem, alive, known[0], known[1])
