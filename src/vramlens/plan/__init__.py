"""The planner: which training configurations fit a GPU, fastest first (``vramlens plan``)."""

from vramlens.plan.answers import ChangeStep, CheapestChange, cheapest_change, min_gpus
from vramlens.plan.model import Candidate, Plan
from vramlens.plan.planner import plan

__all__ = ["Candidate", "ChangeStep", "CheapestChange", "Plan", "cheapest_change", "min_gpus", "plan"]
