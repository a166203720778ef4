"""The memory-saving techniques an experiment can switch on, and how each maps to the workload.

Each technique has a name as the CLI takes it (``bf16``, ``checkpoint``, ``memory-budget=0.05``),
a one-line summary of what the runner does, and the workload keys (``docs/WORKLOAD.md``) the
estimator and simulator see for it. A run combines techniques with ``+``
(``bf16+checkpoint+fused-optimizer``); the run without any is the control.

What the runner does for each (:mod:`vramlens.experiments.runner`), after seed 004's study
(forgather "peak memory" experiments):

* ``bf16`` - the model is cast to bfloat16 (weights, gradients, optimizer state; no fp32 master).
* ``checkpoint`` - activation checkpointing of every decoder layer (transformers, non-reentrant).
* ``compile`` - ``torch.compile`` of the model (inductor); measured with the allocator's own
  events, which a dispatch-mode tracker cannot see (``docs/research/torch-cpu-probes.md`` s. 7).
* ``fused-optimizer`` - the optimizer step in backward, the PyTorch way: one optimizer per
  parameter, stepped and its gradient freed by ``register_post_accumulate_grad_hook``
  (PyTorch tutorial "How to save memory by fusing the optimizer step into the backward pass").
* ``memory-budget=X`` - ``torch.compile`` with ``torch._functorch.config.activation_memory_budget = X``
  (0 < X <= 1): 1 keeps what the default partitioner keeps, 0 recomputes everything in the graph.
* ``chunked-loss`` - cross-entropy over 8 chunks of the sequence, each up-cast to fp32 on its own.
* ``8bit-optimizer`` - bitsandbytes ``AdamW8bit``; only where bitsandbytes imports (else the
  run is recorded as skipped with the reason).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from vramlens._untrusted import brief
from vramlens.errors import InputError

__all__ = [
    "TECHNIQUES",
    "AppliedTechnique",
    "Technique",
    "TechniqueName",
    "combo_label",
    "parse_combo",
    "parse_technique",
    "unavailable_reason",
    "workload_keys",
]


class TechniqueName(StrEnum):
    """Names of the techniques, as the CLI and matrix files spell them."""

    BF16 = "bf16"
    CHECKPOINT = "checkpoint"
    COMPILE = "compile"
    FUSED_OPTIMIZER = "fused-optimizer"
    MEMORY_BUDGET = "memory-budget"
    CHUNKED_LOSS = "chunked-loss"
    OPTIMIZER_8BIT = "8bit-optimizer"


@dataclass(frozen=True, kw_only=True)
class Technique:
    """One entry of the registry."""

    name: TechniqueName
    summary: str
    workload: Mapping[str, Any] = field(default_factory=dict)
    """Workload keys (the contract of ``docs/WORKLOAD.md``) the technique sets for the estimator."""
    takes_value: bool = False
    """``name=X`` with a number in (0, 1] (the memory budget)."""
    needs_module: str | None = None
    """A module that must import for the technique to run on this machine."""
    compiles: bool = False
    """The run is compiled (measured with the allocator's events on CPU)."""

    def __post_init__(self) -> None:
        if self.takes_value and self.name is not TechniqueName.MEMORY_BUDGET:
            raise ValueError(f"takes_value: only {TechniqueName.MEMORY_BUDGET} takes a value")


#: The registry; a new technique is an entry here and a branch in the runner.
TECHNIQUES: dict[TechniqueName, Technique] = {
    t.name: t
    for t in (
        Technique(name=TechniqueName.BF16, summary="pure bfloat16 weights, gradients and optimizer state",
                  workload={"precision": "bf16"}),
        Technique(name=TechniqueName.CHECKPOINT, summary="activation checkpointing of every decoder layer",
                  workload={"recompute": "full"}),
        Technique(name=TechniqueName.COMPILE, summary="torch.compile (inductor)", workload={"compile": True},
                  compiles=True),
        Technique(name=TechniqueName.FUSED_OPTIMIZER,
                  summary="optimizer step in backward (per-parameter post-accumulate-grad hooks)",
                  workload={"optimizer_in_backward": True}),
        Technique(name=TechniqueName.MEMORY_BUDGET,
                  summary="torch.compile with torch._functorch.config.activation_memory_budget",
                  workload={"compile": True}, takes_value=True, compiles=True),
        Technique(name=TechniqueName.CHUNKED_LOSS, summary="cross-entropy over 8 sequence chunks",
                  workload={"loss": "chunked"}),
        Technique(name=TechniqueName.OPTIMIZER_8BIT, summary="bitsandbytes AdamW8bit",
                  workload={"optimizer": "adamw-8bit"}, needs_module="bitsandbytes"),
    )
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class AppliedTechnique:
    """A technique as a run uses it (with its value for ``memory-budget``)."""

    technique: Technique
    value: float | None = None

    def __post_init__(self) -> None:
        if self.technique.takes_value != (self.value is not None):
            raise InputError(
                f"techniques: {self.technique.name} {'needs' if self.technique.takes_value else 'takes no'} value"
            )
        if self.value is not None and not 0 < self.value <= 1:
            raise InputError(f"techniques: {self.technique.name}={self.value:g}; accepted: a number in (0, 1]")

    @property
    def name(self) -> TechniqueName:
        return self.technique.name

    @property
    def label(self) -> str:
        """``bf16``, ``memory-budget=0.05``."""
        return str(self.name) if self.value is None else f"{self.name}={self.value:g}"


def parse_technique(text: str) -> AppliedTechnique:
    """One technique from its label (``checkpoint``, ``memory-budget=0.6``); InputError otherwise."""
    if not isinstance(text, str) or len(text) > 100:
        raise InputError(f"techniques: {brief(text)} is not a technique label (e.g. bf16, memory-budget=0.6)")
    name, sep, raw = text.strip().partition("=")
    accepted = ", ".join(f"{n}=X" if t.takes_value else str(n) for n, t in TECHNIQUES.items())
    try:
        technique = TECHNIQUES[TechniqueName(name.strip().lower())]
    except ValueError:
        raise InputError(f"techniques: unknown technique {text.strip()!r}; accepted: {accepted}") from None
    if not sep:
        return AppliedTechnique(technique=technique)
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"techniques: {text.strip()!r}: the value must be a number in (0, 1]") from None
    return AppliedTechnique(technique=technique, value=value)


def parse_combo(parts: str | Iterable[str]) -> tuple[AppliedTechnique, ...]:
    """A run's techniques from ``"bf16+checkpoint"`` or a list of labels, in registry order;
    ``""``/``"control"``/``[]`` is the control. A technique given twice is an error."""
    if isinstance(parts, str):
        text = parts.strip()
        parts = [] if text.lower() in ("", "control", "none") else text.split("+")
    if not isinstance(parts, (list, tuple)):
        raise InputError(f"techniques: {brief(parts)}; a run's techniques are a list of labels or 'a+b'")
    applied = [parse_technique(part) for part in parts]
    names = [a.name for a in applied]
    repeated = sorted({str(n) for n in names if names.count(n) > 1})
    if repeated:
        raise InputError(f"techniques: {', '.join(repeated)} given twice in one run")
    order = list(TECHNIQUES)
    return tuple(sorted(applied, key=lambda a: order.index(a.name)))


def combo_label(combo: Iterable[AppliedTechnique]) -> str:
    """``bf16+checkpoint``; ``control`` for none."""
    return "+".join(a.label for a in combo) or "control"


def workload_keys(combo: Iterable[AppliedTechnique]) -> dict[str, Any]:
    """The workload keys the techniques set, merged."""
    keys: dict[str, Any] = {}
    for applied in combo:
        keys.update(applied.technique.workload)
    return keys


def unavailable_reason(combo: Iterable[AppliedTechnique]) -> str | None:
    """Why the run cannot happen on this machine (a technique's package does not import), or None."""
    for applied in combo:
        needed = applied.technique.needs_module
        if needed is not None and importlib.util.find_spec(needed) is None:
            return f"{applied.name}: {needed} is not available on this machine"
    return None
