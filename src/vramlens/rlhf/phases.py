"""Which models each algorithm runs in which phase of a step, in step order.

Sources: TRL's PPOTrainer/GRPOTrainer/RLOOTrainer/OnlineDPOTrainer/DPOTrainer training loops
and verl's ``ray_trainer.fit`` (generate -> reward -> reference log-probs -> critic values ->
critic update -> actor update; vramlens shows the actor update first, as TRL does, which
does not change any phase's memory). The actor's own "old log-probs" forward (PPO) is not a
phase of its own: it runs the actor forward without saved activations, below the actor's
training phase on the same GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.rlhf.setup import Algo, Placement, RlhfSetup

__all__ = ["PHASE_NAMES", "PhasePlan", "on_gpu", "step_phases"]

#: Every phase name, in step order (DESIGN.md's RLHF phase vocabulary, split by model).
PHASE_NAMES: tuple[str, ...] = (
    "generation", "scoring", "reference", "values", "actor_training", "critic_training",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class PhasePlan:
    """One phase: the roles it runs and the roles whose weights it needs on the GPU."""

    name: str
    busy: tuple[str, ...]
    needs: tuple[str, ...]
    """Busy roles plus the owners of weights they borrow (HF generate and a LoRA-base
    reference run on the actor's weights)."""
    note: str


def _generation(setup: RlhfSetup) -> PhasePlan:
    per_prompt = setup.group_size
    note = f"rollout ({setup.rollout.engine}): {setup.rollout_batch} prompts x {per_prompt} response(s)"
    borrows = not setup.rollout.own_weights
    needs = ("rollout", "actor") if borrows else ("rollout",)
    return PhasePlan(name="generation", busy=("rollout",), needs=needs, note=note)


def step_phases(setup: RlhfSetup) -> tuple[PhasePlan, ...]:
    """The phases of one step of ``setup.algo``, in order."""
    plans: list[PhasePlan] = []
    if setup.generates:
        plans.append(_generation(setup))
    if setup.reward is not None:
        plans.append(PhasePlan(name="scoring", busy=("reward",), needs=("reward",), note="reward model forward"))
    ref = setup.reference
    if ref is not None:
        needs = ("reference", "actor") if ref.from_actor_base else ("reference",)
        note = "reference log-probs" + (" (actor base, adapters disabled)" if ref.from_actor_base else "")
        plans.append(PhasePlan(name="reference", busy=("reference",), needs=needs, note=note))
    if setup.critic is not None:
        plans.append(PhasePlan(name="values", busy=("critic",), needs=("critic",), note="critic value forward"))
    pairs = " (chosen + rejected pairs)" if setup.algo is Algo.DPO else ""
    plans.append(
        PhasePlan(name="actor_training", busy=("actor",), needs=("actor",), note=f"actor forward+backward+step{pairs}")
    )
    if setup.critic is not None:
        plans.append(
            PhasePlan(name="critic_training", busy=("critic",), needs=("critic",), note="critic forward+backward+step")
        )
    return tuple(plans)


def on_gpu(setup: RlhfSetup, role: str, plan: PhasePlan) -> bool:
    """Whether a role's resident state is on its GPUs during a phase."""
    return setup.placement_of(role) is not Placement.OFFLOAD or role in plan.needs
