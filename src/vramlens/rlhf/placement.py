"""Phase totals per GPU group, and the transitions between phases, from each model's memory.

In a phase, a model's resident state is on its group's GPUs unless it is offloaded and the
phase does not need it; a busy model adds its phase work. A group's level totals:

* allocated = sum of the models' bytes on it;
* reserved = allocated + the allocator slack of the phases' estimates of the busy models
  (resident tensors are large, long-lived blocks that add no slack of their own);
* device = reserved + the largest runtime (CUDA context, workspaces, vLLM's CUDA graphs) of
  the models on the group: one process per GPU, as TRL and verl's hybrid engine run, keeps
  one CUDA context; a sleeping vLLM keeps its CUDA graphs.

A phase is reported on its busiest GPU: the group with the largest device-level total.
Transitions compare consecutive phases (and the last with the next step's first): movable
state (weights, optimizer state) is copied at ``pcie_gbps`` GB/s; KV caches, activations and
gradients are freed and allocated without a copy.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from vramlens.categories import Category
from vramlens.rlhf.models import MOVABLE, ModelMemory, group_gpus
from vramlens.rlhf.phases import PhasePlan, on_gpu
from vramlens.rlhf.report import ModelState, RlhfPhase, Transition
from vramlens.rlhf.setup import RlhfSetup
from vramlens.units import GB

__all__ = ["build_phases", "build_transitions"]


def _add(total: dict[Category, int], part: Mapping[Category, int]) -> None:
    for category, size in part.items():
        total[category] = total.get(category, 0) + size


def _state(setup: RlhfSetup, memory: ModelMemory, plan: PhasePlan) -> tuple[ModelState, dict[Category, int]]:
    busy = memory.role in plan.busy
    held: dict[Category, int] = {}
    resident = on_gpu(setup, memory.role, plan)
    if resident:
        _add(held, memory.resident)
    if busy:
        _add(held, memory.work.get(plan.name, {}))
    if held:
        where = "gpu"
    elif memory.resident:
        where = "cpu"
    else:
        where = "absent"
    state = ModelState(
        role=memory.role, where=where, bytes=sum(held.values()), busy=busy, group=memory.group,
        breakdown={c.value: b for c, b in held.items() if b},
    )  # fmt: skip
    return state, held


def _phase(setup: RlhfSetup, memories: Mapping[str, ModelMemory], plan: PhasePlan) -> RlhfPhase:
    states: dict[str, ModelState] = {}
    groups: dict[str, dict[Category, int]] = {}
    slack: dict[str, int] = {}
    runtime: dict[str, int] = {}
    for role, memory in memories.items():
        state, held = _state(setup, memory, plan)
        states[role] = state
        _add(groups.setdefault(memory.group, {}), held)
        slack[memory.group] = slack.get(memory.group, 0) + (memory.slack.get(plan.name, 0) if state.busy else 0)
        runtime[memory.group] = max(runtime.get(memory.group, 0), memory.runtime_bytes)
    levels = {
        group: (
            sum(parts.values()),
            sum(parts.values()) + slack[group],
            sum(parts.values()) + slack[group] + runtime[group],
        )
        for group, parts in groups.items()
        if group_gpus(setup, group) > 0
    }
    busiest = max(levels, key=lambda g: (levels[g][2], g))
    busy_group = memories[plan.busy[0]].group
    allocated, reserved, device = levels[busiest]
    note = plan.note if busiest == busy_group else f"{plan.note}; busiest GPUs: group {busiest}"
    return RlhfPhase(
        name=plan.name, allocated_bytes=allocated, reserved_bytes=reserved, device_bytes=device,
        breakdown={c.value: b for c, b in groups[busiest].items() if b}, models=states,
        gpu_group=busiest, note=note, busy_group=busy_group,
    )  # fmt: skip


def build_phases(
    setup: RlhfSetup, memories: Mapping[str, ModelMemory], plans: tuple[PhasePlan, ...]
) -> tuple[RlhfPhase, ...]:
    """Each phase of the step on its busiest GPU."""
    return tuple(_phase(setup, memories, plan) for plan in plans)


def _split(setup: RlhfSetup, memory: ModelMemory, plan: PhasePlan) -> tuple[int, int, int]:
    """(movable resident bytes, other resident bytes, work bytes) a role holds in a phase."""
    if not on_gpu(setup, memory.role, plan):
        movable = other = 0
    else:
        movable = sum(b for c, b in memory.resident.items() if c in MOVABLE)
        other = sum(b for c, b in memory.resident.items() if c not in MOVABLE)
    work = sum(memory.work.get(plan.name, {}).values()) if memory.role in plan.busy else 0
    return movable, other, work


def _between(setup: RlhfSetup, memory: ModelMemory, before: PhasePlan, after: PhasePlan) -> list[Transition]:
    old, new = _split(setup, memory, before), _split(setup, memory, after)
    seconds_per_byte = 1.0 / (setup.pcie_gbps * GB)
    moves: list[tuple[str, int, float]] = []
    if old[2]:
        moves.append(("free", old[2], 0.0))
    if old[0] > new[0]:
        moves.append(("offload", old[0] - new[0], (old[0] - new[0]) * seconds_per_byte))
    if old[1] > new[1]:
        moves.append(("free", old[1] - new[1], 0.0))
    if new[0] > old[0]:
        moves.append(("load", new[0] - old[0], (new[0] - old[0]) * seconds_per_byte))
    if new[1] > old[1]:
        moves.append(("allocate", new[1] - old[1], 0.0))
    if new[2]:
        moves.append(("allocate", new[2], 0.0))
    return [
        Transition(before=before.name, after=after.name, role=memory.role, action=a, bytes=b, seconds=s)
        for a, b, s in moves
    ]


def build_transitions(
    setup: RlhfSetup, memories: Mapping[str, ModelMemory], plans: tuple[PhasePlan, ...]
) -> tuple[Transition, ...]:
    """What each model frees, offloads, loads and allocates between consecutive phases
    (the last phase wraps around to the next step's first)."""
    if len(plans) < 2:
        return ()
    pairs = [*itertools.pairwise(plans), (plans[-1], plans[0])]
    return tuple(
        t for before, after in pairs for memory in memories.values() for t in _between(setup, memory, before, after)
    )
