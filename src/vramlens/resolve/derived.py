"""Quantities derived from a workload, each defined once; the estimator, the step-time model and
the simulator's checks all call these instead of re-deriving them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vramlens.workload.spec import Workload

__all__ = ["checkpointed_layers", "seq_per_rank"]


def seq_per_rank(workload: Workload) -> int:
    """Tokens of one sequence on one context-parallel rank: ``seq / cp`` (ring attention and
    Ulysses split the sequence evenly; :func:`vramlens.resolve.context.resolve_training` refuses
    a ``seq`` that ``cp`` does not divide, so the division is exact)."""
    return workload.seq // workload.parallel.cp


def checkpointed_layers(workload: Workload, layers: int) -> int:
    """Of ``layers`` decoder layers, how many are checkpointed under ``recompute_every: k``: one in
    every k, starting with the first, i.e. ``ceil(layers / k)`` (transformers'
    ``gradient_checkpointing`` wraps every layer: k = 1)."""
    return math.ceil(layers / workload.recompute_every)
