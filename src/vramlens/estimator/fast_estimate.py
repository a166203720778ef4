"""A training estimate's figures without its terms: what a planner's sweep of sizes needs.

For one model and one set of size-free workload keys (a :class:`~vramlens.estimator.training`
plan), :class:`FastEstimate` computes each stage's quantities without their terms
(:meth:`~vramlens.estimator.stage_plan.StagePlan.numbers`), the phases' bytes from their trace
(:mod:`vramlens.estimator.phase_trace`), the busiest stage and phase as the estimate picks them,
and the levels above (:func:`~vramlens.estimator.training.levels`, the same code). The report's
terms, formulas and notes, which callers rarely read, are made when first read by
:func:`~vramlens.estimator.training.reference_estimate`, which also checks that its figures are
these (:meth:`~vramlens.result.report.MemoryReport.presented_later`). Where a phase trace's
guards do not hold for a workload, the estimate is made term by term, and its trace kept too.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from operator import methodcaller
from typing import TYPE_CHECKING

from vramlens.categories import Category
from vramlens.estimator import training
from vramlens.estimator.phase_trace import PhaseTrace, trace_phases
from vramlens.estimator.quantities import stage_memory
from vramlens.estimator.stage_memory import StageMemory
from vramlens.hardware import GpuSpec
from vramlens.resolve.context import TrainingContext
from vramlens.result.presented import presented_later, terms_later
from vramlens.result.report import MemoryReport, Term

if TYPE_CHECKING:
    from vramlens.estimator.training import _Plan

__all__ = ["TRACES_PER_STAGE", "FastEstimate"]

#: Phase traces kept per stage (each for one path through the phases' code).
TRACES_PER_STAGE = 8


class FastEstimate:
    """Each stage's phase traces (see the module docstring)."""

    __slots__ = ("traces",)

    def __init__(self, traces: list[list[PhaseTrace]]) -> None:
        self.traces = traces

    @classmethod
    def of(cls, ctx: TrainingContext, memories: list[StageMemory]) -> FastEstimate | None:
        """The fast estimate of ``ctx``'s plan, traced on its stages' memories; None if a stage's
        phases cannot be traced."""
        traces = [trace_phases(ctx, mem) for mem in memories]
        if any(trace is None for trace in traces):
            return None
        return cls([[trace] for trace in traces if trace is not None])

    def learn(self, ctx: TrainingContext, memories: list[StageMemory]) -> None:
        """Keep the traces of a workload none of the traces described (up to :data:`TRACES_PER_STAGE`)."""
        for known, mem in zip(self.traces, memories, strict=True):
            if len(known) < TRACES_PER_STAGE and (trace := trace_phases(ctx, mem)) is not None:
                known.append(trace)

    def estimate(self, ctx: TrainingContext, plan: _Plan, gpu: GpuSpec | None) -> MemoryReport | None:
        """``ctx``'s report (terms made when read), or None where a trace does not describe it."""
        layout = plan.layout
        best: tuple[int, int, StageMemory, PhaseTrace, Sequence[int | float], list[tuple[str, str, int]]] | None = None
        for index, stage in enumerate(layout.stages):
            mem = stage_memory(ctx, stage, layout.targets, plan.stages[index], terms=False)
            for trace in self.traces[index]:
                if (found := trace.phases_of(mem)) is not None:
                    break
            else:
                return None
            values, phases = found
            peak, highest = 0, phases[0][2]
            for phase in range(1, len(phases)):
                if phases[phase][2] > highest:
                    peak, highest = phase, phases[phase][2]
            if best is None or highest > best[0]:
                best = (highest, peak, mem, trace, values, phases)
        assert best is not None
        allocated, peak, mem, trace, values, phases = best
        breakdown = trace.breakdown(peak, values)
        found_levels = training.levels(ctx, mem, allocated, breakdown, layout.targets, plan)
        made = _Made(ctx, plan, gpu)
        sums, terms = trace.breakdowns, _phase_terms(len(phases))
        later = []
        for index, (name, note, bytes_) in enumerate(phases):
            if index == peak:  # its breakdown is the one the levels read
                later.append(terms_later(name, bytes_, note, _given, breakdown, terms[index], made))
            else:
                later.append(terms_later(name, bytes_, note, sums[index], values, terms[index], made))
        report = presented_later(
            made.report,
            {
                "engine": "estimate",
                "model": ctx.spec.name,
                "workload": ctx.workload,
                "phases": tuple(later),
                "peak_phase": phases[peak][0],
                "allocated_bytes": allocated,
                "reserved_bytes": found_levels.reserved,
                "device_bytes": found_levels.device,
                "runtime": dict(found_levels.runtime.parts),
                "safe": found_levels.safe,
                "runtime_terms": found_levels.runtime.terms,
                "gpu": gpu.name if gpu else None,
                "capacity_bytes": gpu.memory_bytes if gpu else None,
            },
        )
        made.fast = weakref.ref(report)
        return report


class _Made:
    """The report made term by term for a fast one, once (its terms and the phases'). It holds the
    fast report weakly: the report holds it (and its phases do), and a cycle would leave every
    report to the garbage collector instead of freeing it when the caller drops it."""

    __slots__ = ("ctx", "fast", "gpu", "made", "plan")

    def __init__(self, ctx: TrainingContext, plan: _Plan, gpu: GpuSpec | None) -> None:
        self.ctx, self.plan, self.gpu = ctx, plan, gpu
        self.fast: weakref.ref[MemoryReport] | None = None
        self.made: MemoryReport | None = None

    def report(self) -> MemoryReport:
        if self.made is None:
            self.made = training.reference_estimate(self.ctx, self.plan, self.gpu)[0]
        return self.made

    def terms(self, phase: int) -> list[Term]:
        """Phase ``phase``'s terms, from the fast report's presentation (which checks its figures), or
        from the report made term by term once the fast one is gone (the phase checks their sum)."""
        fast = self.fast() if self.fast is not None else None
        presented = fast.presented() if fast is not None else self.report()  # type: ignore[attr-defined]
        return list(presented.phases[phase].terms)


def _phase_terms(count: int) -> Sequence[Callable[[_Made], list[Term]]]:
    """``made -> made.terms(index)`` for each phase index, at least ``count`` of them (each made once)."""
    while len(_PHASE_TERMS) < count:
        _PHASE_TERMS.append(methodcaller("terms", len(_PHASE_TERMS)))
    return _PHASE_TERMS


_PHASE_TERMS: list[Callable[[_Made], list[Term]]] = []


def _given(breakdown: dict[Category, int]) -> dict[Category, int]:
    return breakdown
