"""RLHF memory: several models over the phases of a step (``vramlens rlhf``).

:func:`load_rlhf` builds an :class:`RlhfSetup` (algorithm, models, rollout engine, GPUs);
:func:`rlhf_estimate` returns an :class:`RlhfReport`: each phase's per-GPU memory on its
busiest GPU, what each model holds, the transitions between phases with their PCIe time,
the peak phase, whether it fits, and recommendations. Pure Python on the analytic estimator.
"""

from vramlens.rlhf.engine import rlhf_estimate
from vramlens.rlhf.load import load_rlhf
from vramlens.rlhf.phases import PHASE_NAMES
from vramlens.rlhf.report import ModelState, Recommendation, RlhfPhase, RlhfReport, Transition
from vramlens.rlhf.setup import ROLES, Algo, ModelRole, Placement, RlhfSetup, RolloutSetup

__all__ = [
    "PHASE_NAMES",
    "ROLES",
    "Algo",
    "ModelRole",
    "ModelState",
    "Placement",
    "Recommendation",
    "RlhfPhase",
    "RlhfReport",
    "RlhfSetup",
    "RolloutSetup",
    "Transition",
    "load_rlhf",
    "rlhf_estimate",
]
