"""What :func:`vramlens.rlhf.rlhf_estimate` returns: phases, transitions, peak, recommendations.

All bytes are ints, per GPU; a phase's figures are those of its busiest GPU (the group whose
device-level total is largest in that phase). The dictionary form is
:func:`vramlens.rlhf.serialize.report_to_dict` (``RlhfReport.to_dict``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vramlens.rlhf.setup import RlhfSetup

__all__ = ["ModelState", "Recommendation", "RlhfPhase", "RlhfReport", "Transition"]


@dataclass(frozen=True, kw_only=True)
class ModelState:
    """One model (role) during one phase."""

    role: str
    """"actor", "critic", "reward", "reference" or "rollout"."""
    where: str
    """"gpu", "cpu" (offloaded, asleep) or "absent" (nothing held, e.g. HF generate's KV cache
    between generations)."""
    bytes: int
    """Allocated bytes per GPU of its group in this phase (0 unless on the GPU)."""
    breakdown: Mapping[str, int]
    """Category -> bytes of ``bytes``."""
    busy: bool
    """Whether this phase runs the model."""
    group: str = "all"
    """The GPU group the model lives on ("all", "shared" or the role's own group)."""


@dataclass(frozen=True, kw_only=True)
class RlhfPhase:
    """One phase of a step on its busiest GPU."""

    name: str
    """"generation", "scoring", "reference", "values", "actor_training" or "critic_training"."""
    allocated_bytes: int
    reserved_bytes: int
    device_bytes: int
    breakdown: Mapping[str, int]
    """Category -> allocated bytes on the busiest GPU."""
    models: Mapping[str, ModelState]
    gpu_group: str
    """The group of the busiest GPU: "all" without separate groups, else "shared" or a role."""
    note: str
    busy_group: str = "all"
    """The group that runs the phase (may differ from ``gpu_group`` when another group is fuller)."""


@dataclass(frozen=True, kw_only=True)
class Transition:
    """What changes on a GPU for one model between two consecutive phases."""

    before: str
    after: str
    role: str
    action: str
    """"load" (CPU -> GPU), "offload" (GPU -> CPU), "free" or "allocate" (no copy)."""
    bytes: int
    """Per GPU."""
    seconds: float
    """``bytes`` over the PCIe link at ``setup.pcie_gbps`` GB/s; 0 for free and allocate."""


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """One change that lowers the device-level peak, and by how much."""

    text: str
    saves_bytes: int
    """Device-level peak before minus after (per GPU)."""
    changes: tuple[tuple[str, Any, Any], ...]
    """(setup key, old value, new value), e.g. ("reference.placement", "colocated", "offload")."""


@dataclass(frozen=True, kw_only=True)
class RlhfReport:
    """Per-GPU memory of one RLHF step, phase by phase."""

    setup: RlhfSetup
    phases: tuple[RlhfPhase, ...]
    transitions: tuple[Transition, ...]
    peak_phase: str
    """The phase with the largest device-level memory."""
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_device_bytes: int
    capacity_bytes: int
    """Usable memory of one GPU."""
    fits: bool
    """Device-level peak <= capacity (a vLLM pool too small for every sequence at once only
    queues them, which the assumptions say)."""
    recommendations: tuple[Recommendation, ...]
    assumptions: tuple[str, ...]

    @property
    def peak(self) -> RlhfPhase:
        return next(phase for phase in self.phases if phase.name == self.peak_phase)

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.peak_device_bytes

    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe form (``vramlens rlhf --format json``)."""
        from vramlens.rlhf.serialize import report_to_dict

        return report_to_dict(self)
