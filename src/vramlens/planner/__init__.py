"""The planner: which training configurations fit a GPU, fastest first (``vramlens plan``)."""

from vramlens.planner.answers import ChangeStep, CheapestChange, cheapest_change, min_gpus
from vramlens.planner.model import Candidate, Plan
from vramlens.planner.planner import plan

__all__ = ["Candidate", "ChangeStep", "CheapestChange", "Plan", "cheapest_change", "min_gpus", "plan"]
