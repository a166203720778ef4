"""What every picture of an RLHF step draws (numpy only): per phase, the busiest GPU's memory
stacked by category, or by model.

One module feeds the terminal timeline (:mod:`vramlens.rlhf.render.text`), the static plot
(:mod:`vramlens.rlhf.render.plot`) and the HTML page (:mod:`vramlens.rlhf.render.html`), so the
three agree with each other and with ``vramlens rlhf --format json``.

* **By category** (:func:`rlhf_series`): a :class:`~vramlens.report.series.StackedSeries` over
  the step's phases (``x_unit="phase"``, one point per phase), drawn at the **device level**:
  the phase's breakdown (allocated bytes by :class:`~vramlens.categories.Category`), then
  ``allocator slack`` (reserved - allocated) and ``runtime`` (device - reserved), so each bar is
  as tall as what the GPU really holds and can be read against the capacity line, which is what
  :attr:`RlhfReport.fits` compares. The same series type as a single-model estimate, so the
  existing terminal timeline, stacked phase bars and HTML chart draw it unchanged.
* **By model** (:func:`model_segments`): for one phase, the bytes each model (role) holds on the
  GPU in that phase, then ``shared`` (allocated bytes no model claims, e.g. a rollout engine's
  pool when it is not a model of its own) and ``allocator + runtime`` (device - allocated).

Bytes are per GPU, on the busiest GPU of the phase (the RLHF engine's convention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vramlens.categories import Category
from vramlens.report.series import StackedSeries, phase_series

if TYPE_CHECKING:
    from vramlens.rlhf import RlhfPhase, RlhfReport

__all__ = ["ROLE_LOOKS", "RoleLook", "model_segments", "peak_index", "rlhf_series", "role_look"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RoleLook:
    """How one model (role) is drawn in the by-model pictures."""

    hex: str
    """``#rrggbb`` for plots and HTML."""
    rich: str
    """A rich color for the terminal."""
    ascii: str
    """The fill letter in plain ASCII (lower case: the category letters are upper case)."""
    block: str
    """The fill character in Unicode (shades, so the roles differ without colors too)."""
    label: str


#: One look per role the RLHF engine names, in stacking order (bottom first); ``shared`` and
#: ``overhead`` are the two non-model segments of :func:`model_segments`. Colors chosen to be
#: told apart from each other and from the category palette (a model holds several categories, and
#: both pictures are often side by side).
ROLE_LOOKS: dict[str, RoleLook] = {
    "actor": RoleLook(hex="#1d3557", rich="steel_blue3", ascii="a", block="█", label="actor"),
    "critic": RoleLook(hex="#6a994e", rich="dark_olive_green3", ascii="c", block="▓", label="critic"),
    "reward": RoleLook(hex="#b56576", rich="hot_pink3", ascii="r", block="▒", label="reward"),
    "reference": RoleLook(hex="#7fb7be", rich="light_slate_grey", ascii="f", block="░", label="reference"),
    "rollout": RoleLook(hex="#e07a5f", rich="light_salmon3", ascii="g", block="▚", label="rollout engine"),
    "shared": RoleLook(hex="#9a9a9a", rich="grey62", ascii="s", block="▪", label="shared (no model)"),
    "overhead": RoleLook(hex="#d0d0d0", rich="grey78", ascii=".", block="·", label="allocator + runtime"),
}
_FALLBACK = RoleLook(hex="#8c6d52", rich="tan", ascii="m", block="▞", label="")


def role_look(role: str) -> RoleLook:
    """The look of ``role`` (an unknown role gets a neutral one with its own name)."""
    look = ROLE_LOOKS.get(role)
    if look is not None:
        return look
    return RoleLook(hex=_FALLBACK.hex, rich=_FALLBACK.rich, ascii=_FALLBACK.ascii, block=_FALLBACK.block, label=role)


def _category(name: str) -> Category:
    """A breakdown key as a Category (an unknown name counts as ``other``)."""
    try:
        return Category(name)
    except ValueError:
        return Category.OTHER


def _phase_categories(phase: RlhfPhase) -> dict[Category, int]:
    """The phase's device-level stack: its breakdown, allocator slack and runtime."""
    stack: dict[Category, int] = {}
    for name, value in phase.breakdown.items():
        category = _category(str(name))
        stack[category] = stack.get(category, 0) + int(value)
    stack[Category.ALLOCATOR_SLACK] = stack.get(Category.ALLOCATOR_SLACK, 0) + max(
        phase.reserved_bytes - phase.allocated_bytes, 0
    )
    stack[Category.RUNTIME] = stack.get(Category.RUNTIME, 0) + max(phase.device_bytes - phase.reserved_bytes, 0)
    return stack


def peak_index(report: RlhfReport) -> int:
    """Index of the report's peak phase (the highest device level when the name is not found)."""
    names = [phase.name for phase in report.phases]
    if report.peak_phase in names:
        return names.index(report.peak_phase)
    levels = [phase.device_bytes for phase in report.phases]
    return int(np.argmax(levels)) if levels else -1


def rlhf_series(report: RlhfReport) -> StackedSeries:
    """The step's phases stacked by category at the device level (see the module docstring)."""
    return phase_series(
        [phase.name for phase in report.phases],
        [_phase_categories(phase) for phase in report.phases],
        peak=peak_index(report),
        capacity_bytes=report.capacity_bytes,
        level="device",
    )


def model_segments(phase: RlhfPhase) -> list[tuple[str, int]]:
    """``(role, bytes)`` on the phase's busiest GPU, bottom first: the models on its group in
    :data:`ROLE_LOOKS` order (then any other role by name), ``shared`` and ``overhead``.
    Empty segments are left out; the segments add up to the phase's device level (unless the
    models claim more than the phase's allocated bytes, which the engine never reports)."""
    order = {role: index for index, role in enumerate(ROLE_LOOKS)}
    on_gpu = [
        (role, int(state.bytes))
        for role, state in phase.models.items()
        if state.where == "gpu" and (phase.gpu_group == "all" or state.group == phase.gpu_group)
    ]
    on_gpu.sort(key=lambda item: (order.get(item[0], len(order)), item[0]))
    segments = [(role, value) for role, value in on_gpu if value > 0]
    claimed = sum(value for _, value in segments)
    segments.append(("shared", max(phase.allocated_bytes - claimed, 0)))
    segments.append(("overhead", max(phase.device_bytes - max(phase.allocated_bytes, claimed), 0)))
    return [(role, value) for role, value in segments if value > 0]
