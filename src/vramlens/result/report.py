"""``MemoryReport``: what every engine returns (estimate, simulate, measured, snapshot).

The dictionary form (:meth:`MemoryReport.to_dict`) is the report contract of
``shared/docs/WORKLOAD.md``: ``peak`` (allocated/reserved/device bytes and the
peak phase), ``breakdown`` at the peak (allocated level), ``phases``, ``fits``,
``headroom_bytes``, ``assumptions``, ``engine`` and the normalized ``workload``,
plus the explanation terms and runtime parts. All byte values are ints, per GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from vramlens.categories import Category

if TYPE_CHECKING:
    from vramlens.result.timeline import Timeline

__all__ = ["LEVELS", "Margin", "MemoryReport", "PhaseMemory", "SafeLevels", "ServingCapacity", "Term"]

#: The three levels of a peak, each containing the one before it.
LEVELS = ("allocated", "reserved", "device")


@dataclass(frozen=True, kw_only=True, slots=True)
class Term:
    """One explained quantity: what it is, its category, its bytes and how they were computed."""

    name: str
    category: Category
    bytes: int
    explain: Callable[[], str] | str
    """A human-checkable formula with the numbers filled in (or a function producing it,
    so that estimates that are never shown do not pay for formatting)."""
    alive: str = ""
    """When the bytes are alive (e.g. "whole step", "forward to the loss's backward", "at the loss")."""

    @property
    def formula(self) -> str:
        return self.explain if isinstance(self.explain, str) else self.explain()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "category": self.category.value,
            "bytes": self.bytes,
            "formula": self.formula,
            "alive": self.alive,
        }


def terms_bytes(terms: tuple[Term, ...]) -> int:
    """The bytes of ``terms`` together."""
    return sum(map(_bytes_of, terms))


_bytes_of = attrgetter("bytes")


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseMemory:
    """Allocated memory at the high point of one phase, by category (and, for estimates, the
    terms alive at that instant: :meth:`of_terms`)."""

    name: str
    allocated_bytes: int
    breakdown: Mapping[Category, int]
    note: str = ""
    """What the high point is (e.g. "start of backward: logits gradient live")."""
    terms: tuple[Term, ...] = ()
    """Estimates: the quantities alive at the high point; they add up to ``allocated_bytes``."""

    def __post_init__(self) -> None:
        if self.terms and terms_bytes(self.terms) != self.allocated_bytes:
            raise ValueError(
                f"phase {self.name}: terms add up to {terms_bytes(self.terms)}, not {self.allocated_bytes}"
            )

    @classmethod
    def of_terms(cls, name: str, note: str, terms: list[Term]) -> PhaseMemory:
        """The phase whose high point is exactly ``terms`` (zero terms dropped): allocated bytes
        and breakdown are their sums."""
        kept: list[Term] = []
        breakdown: dict[Category, int] = {}
        total = 0
        for term in terms:
            if amount := term.bytes:
                kept.append(term)
                total += amount
                breakdown[term.category] = breakdown.get(term.category, 0) + amount
        clean = {category: value for category, value in breakdown.items() if value}
        return cls(name=name, allocated_bytes=total, breakdown=clean, note=note, terms=tuple(kept))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "allocated_bytes": self.allocated_bytes,
            "breakdown": {c.value: b for c, b in self.breakdown.items() if b},
            "note": self.note,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ServingCapacity:
    """The KV cache of an inference run on one GPU: what the workload needs, what the engine has."""

    engine: str
    """"hf" or "vllm"."""
    sequences: int
    """Sequences the workload runs at once (its ``batch``)."""
    tokens_per_sequence: int
    """Prompt + generated tokens of one sequence."""
    kv_bytes_per_token: int
    """KV bytes of one token over the rank's layers (before window caps and paging)."""
    kv_bytes_needed: int
    """KV bytes of ``batch`` sequences at ``tokens_per_sequence`` (window-capped, paged for vLLM)."""
    budget_bytes: int | None = None
    """vLLM: ``gpu_memory_utilization x capacity``."""
    kv_pool_bytes: int | None = None
    """vLLM: the KV cache it pre-allocates (budget minus weights, activation peak, non-torch memory, CUDA graphs)."""
    kv_block_bytes: int | None = None
    """vLLM: bytes of one block of ``block_size`` tokens over all layers."""
    kv_blocks: int | None = None
    """vLLM: blocks in the pool."""
    max_concurrent_sequences: int | None = None
    """vLLM: sequences of ``tokens_per_sequence`` that fit in the pool at once (at most ``max_num_seqs``)."""

    @property
    def fits(self) -> bool | None:
        """Whether the pool holds the workload's sequences at once ("the batch fits the pool"); None without a pool."""
        if self.kv_pool_bytes is None:
            return None
        return self.kv_pool_bytes > 0 and self.kv_bytes_needed <= self.kv_pool_bytes

    @property
    def engine_bytes(self) -> int | None:
        """vLLM: what the engine takes from its budget before the KV pool (weights, profiled activation
        peak, non-torch memory, CUDA graphs) = budget - pool; None without a GPU."""
        if self.budget_bytes is None or self.kv_pool_bytes is None:
            return None
        return self.budget_bytes - self.kv_pool_bytes

    @property
    def engine_starts(self) -> bool | None:
        """vLLM: whether the engine starts - its weights, activation peak and non-torch memory leave a
        KV pool that holds at least one sequence of ``tokens_per_sequence`` (vLLM refuses to start
        when the pool cannot hold one sequence of ``max_model_len``); None without a GPU."""
        if self.kv_pool_bytes is None:
            return None
        one = -(-self.kv_bytes_needed // max(self.sequences, 1))
        return self.kv_pool_bytes > 0 and self.kv_pool_bytes >= one

    def to_dict(self) -> dict[str, Any]:
        names = (
            "engine", "sequences", "tokens_per_sequence", "kv_bytes_per_token", "kv_bytes_needed", "budget_bytes",
            "kv_pool_bytes", "kv_block_bytes", "kv_blocks", "max_concurrent_sequences", "engine_bytes",
            "engine_starts",
        )  # fmt: skip
        return {name: getattr(self, name) for name in names} | {"fits": self.fits, "batch_fits_pool": self.fits}


@dataclass(frozen=True, kw_only=True, slots=True)
class Margin:
    """What one kind of term may add beyond its point estimate, and where the figure comes from."""

    kind: str
    """framework rules, data noise, modelled allocator or measured constants."""
    level: str
    """The lowest level it applies to (allocated, reserved or device); higher levels include it."""
    bytes: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "level": self.level, "bytes": self.bytes, "source": self.source}


@dataclass(frozen=True, kw_only=True, slots=True)
class SafeLevels:
    """Each level's safe figure: the point estimate plus the margins of the terms it contains,
    sized so that at least 95% of the public measurements are at or below it."""

    allocated_bytes: int
    reserved_bytes: int
    device_bytes: int
    margins: tuple[Margin, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "allocated_bytes": self.allocated_bytes,
            "reserved_bytes": self.reserved_bytes,
            "device_bytes": self.device_bytes,
            "margins": [margin.to_dict() for margin in self.margins],
        }


@dataclass(frozen=True, kw_only=True)
class MemoryReport:
    """Per-GPU memory of one workload: phases, peak at three levels, fit, and why."""

    engine: str
    """"estimate", "simulate", "measured" or "snapshot"."""
    model: str
    workload: Any
    """The workload: a :class:`~vramlens.workload.Workload` or its normalized dict."""
    phases: tuple[PhaseMemory, ...]
    peak_phase: str
    allocated_bytes: int
    """Peak of torch.cuda.max_memory_allocated()."""
    reserved_bytes: int
    """Peak of torch.cuda.max_memory_reserved() (allocated + allocator slack)."""
    device_bytes: int
    """What nvidia-smi shows for the process (reserved + runtime)."""
    gpu: str | None = None
    capacity_bytes: int | None = None
    """Usable memory of the GPU (what torch reports as total_memory), if a GPU was given."""
    runtime: Mapping[str, int] = field(default_factory=dict)
    """Memory outside PyTorch's allocator, by part (cuda_context, cublas_workspace, nccl)."""
    terms: tuple[Term, ...] = ()
    """Estimates: every quantity computed, at its full size, with its formula (the peak's own
    terms are :meth:`peak_terms`)."""
    allocator_terms: tuple[Term, ...] = ()
    """Estimates: what the reserved level adds to the allocated peak (allocator slack, by part)."""
    runtime_terms: tuple[Term, ...] = ()
    """Estimates: what the device level adds to the reserved one (memory outside the allocator, by part)."""
    assumptions: tuple[str, ...] = ()
    serving: ServingCapacity | None = None
    """Inference: the KV cache needed and, for vLLM, the pool it gets."""
    timeline: Timeline | None = field(default=None, repr=False, compare=False)
    """Every tensor event of the run (simulated or measured reports; None for estimates)."""
    device_known: bool = True
    """False for a measured record that did not record the device level: ``device_bytes``
    then repeats ``reserved_bytes`` and the JSON says null for it (and for the runtime)."""
    safe: SafeLevels | None = None
    """Estimates: each level's safe figure and its margins (None for measured and simulated runs)."""

    def __post_init__(self) -> None:
        names = [phase.name for phase in self.phases]
        if self.peak_phase not in names:
            raise ValueError(f"peak_phase {self.peak_phase!r} is not one of the phases {names}")
        peak = self.peak
        if peak.terms:
            found = peak.allocated_bytes  # its terms add up to it (PhaseMemory checks that)
            levels = ((self.allocated_bytes, ()), (self.reserved_bytes, self.allocator_terms))
            for level, (figure, added) in zip(LEVELS, (*levels, (self.device_bytes, self.runtime_terms)), strict=True):
                found += terms_bytes(added)
                if found != figure:
                    raise ValueError(f"{level} terms add up to {found}, not the {level} peak {figure}")

    @classmethod
    def presented_later(cls, present: Callable[[], MemoryReport], **fields: Any) -> MemoryReport:
        """A report of ``fields`` whose terms, allocator terms and assumptions are made when first
        read: those of ``present()``, a report of the same figures made term by term
        (:mod:`vramlens.result.presented`, which checks them)."""
        from vramlens.result.presented import presented_later

        return presented_later(present, fields)

    def level_bytes(self, level: str) -> int:
        """The peak at ``level`` (one of :data:`LEVELS`)."""
        return {"allocated": self.allocated_bytes, "reserved": self.reserved_bytes, "device": self.device_bytes}[level]

    def peak_terms(self, level: str = "allocated") -> tuple[Term, ...]:
        """The terms that make the peak at ``level`` (one of :data:`LEVELS`): the peak phase's
        terms, then the allocator's, then the runtime's; empty when the report has no terms."""
        if level not in LEVELS:
            raise ValueError(f"level: {level!r} is not one of {', '.join(LEVELS)}")
        terms = self.peak.terms
        if level != "allocated":
            terms += self.allocator_terms
        if level == "device":
            terms += self.runtime_terms
        return terms

    @property
    def peak(self) -> PhaseMemory:
        """The phase with the highest allocated memory."""
        return next(phase for phase in self.phases if phase.name == self.peak_phase)

    @property
    def breakdown(self) -> Mapping[Category, int]:
        """Allocated bytes by category at the peak."""
        return self.peak.breakdown

    @property
    def allocator_slack_bytes(self) -> int:
        return self.reserved_bytes - self.allocated_bytes

    @property
    def runtime_bytes(self) -> int:
        return self.device_bytes - self.reserved_bytes

    @property
    def fit_bytes(self) -> int:
        """The device-level figure compared with a GPU: the safe one when the report has it."""
        return self.safe.device_bytes if self.safe is not None else self.device_bytes

    @property
    def fits(self) -> bool | None:
        """Whether the device level (its safe figure for an estimate) fits the GPU and, for vLLM,
        the engine starts and the sequences fit its KV pool; None when no GPU was given."""
        if self.capacity_bytes is None:
            return None
        serving = self.serving
        pool_fits = serving.fits if serving is not None else None
        starts = serving.engine_starts if serving is not None else None
        return self.fit_bytes <= self.capacity_bytes and pool_fits is not False and starts is not False

    @property
    def headroom_bytes(self) -> int | None:
        """Capacity minus the device level compared with it (:attr:`fit_bytes`; negative: short by
        that much), for every engine: vLLM's pool is part of that peak, and how full the pool is
        stands in ``serving``."""
        if self.capacity_bytes is None:
            return None
        return self.capacity_bytes - self.fit_bytes

    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe report contract."""
        return {
            "engine": self.engine,
            "model": self.model,
            "peak": {
                "allocated_bytes": self.allocated_bytes,
                "reserved_bytes": self.reserved_bytes,
                "device_bytes": self.device_bytes if self.device_known else None,
                "phase": self.peak_phase,
            },
            "breakdown": {c.value: b for c, b in self.breakdown.items() if b},
            "levels": {
                "allocator_slack_bytes": self.allocator_slack_bytes,
                "runtime_bytes": self.runtime_bytes if self.device_known else None,
                "runtime": dict(self.runtime),
            },
            "phases": [phase.to_dict() for phase in self.phases],
            "gpu": None if self.gpu is None else {"name": self.gpu, "capacity_bytes": self.capacity_bytes},
            "safe": None if self.safe is None else self.safe.to_dict(),
            "fits": self.fits,
            "headroom_bytes": self.headroom_bytes,
            "terms": [term.to_dict() for term in self.terms],
            "peak_terms": None
            if not self.peak.terms
            else {
                "allocated": [term.to_dict() for term in self.peak.terms],
                "allocator": [term.to_dict() for term in self.allocator_terms],
                "runtime": [term.to_dict() for term in self.runtime_terms],
            },
            "assumptions": list(self.assumptions),
            "settings": _settings(self),
            "serving": None if self.serving is None else self.serving.to_dict(),
            "timeline": None if self.timeline is None else _timeline_summary(self.timeline),
            "workload": self.workload_dict,
        }

    @property
    def workload_dict(self) -> dict[str, Any]:
        """The normalized workload (every default filled in), JSON-safe."""
        if isinstance(self.workload, Mapping):
            return dict(self.workload)
        from vramlens.workload.load import workload_to_dict

        return workload_to_dict(self.workload)


def _settings(report: MemoryReport) -> list[dict[str, Any]]:
    """The report's main settings and where each came from (:mod:`vramlens.result.settings`)."""
    from vramlens.result.settings import settings_dicts

    return settings_dicts(report)


def _timeline_summary(timeline: Timeline) -> dict[str, Any]:
    """What a JSON report says about its timeline (the events themselves are saved with ``--timeline``)."""
    return {
        "events": len(timeline),
        "level": timeline.level,
        "peak_bytes": timeline.peak_bytes,
        "phase_peaks": timeline.phase_peaks(),
    }
