"""Safe figures: each level's point estimate plus a margin per kind of term.

A point estimate is what the model of the code predicts; a run can need more. The margin adds,
per kind of term, how far that kind has been seen to go beyond its point:

* **framework rules** (allocated): activations, logits and temporaries follow a framework's
  implementation, which changes between versions and options the workload cannot name:
  :data:`RULES_FRACTION` of those bytes at the peak;
* **data noise** (allocated): what a published measurement carries that no configuration says
  (variable-length batches, library versions, charts read by eye): :data:`NOISE_FRACTION` of the
  allocated peak;
* **modelled allocator** (reserved): the per-layer slack is a median of replays whose upper
  quartiles reach several times it (:mod:`vramlens.estimator.reserved`):
  ``LAYER_SLACK_SPREAD`` of the churning memory;
* **measured constants** (device): each runtime part's largest cited value above the one used
  (:data:`RUNTIME_SPREAD`).

``RULES_FRACTION`` and ``NOISE_FRACTION`` are calibrated on the public measurements
(``python benchmarks/accuracy.py --calibrate``: the smallest values for which the safe figure of
every level covers at least 95% of shared/validation's points); the others come from their sources.
The safe figures are what ``fits``, the planner and the capacity search compare with a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from vramlens._records import maker
from vramlens.categories import Category
from vramlens.result.report import Margin, SafeLevels
from vramlens.units import MiB

__all__ = [
    "ALLOCATOR_SPREAD_SCALE",
    "NOISE_FRACTION",
    "RULES_FRACTION",
    "RUNTIME_SPREAD",
    "runtime_spread",
    "safe_levels",
]

#: Calibrated (benchmarks/accuracy.py --calibrate, shared/validation public_scenarios.jsonl).
RULES_FRACTION: Final = 0.0
NOISE_FRACTION: Final = 0.08
#: Calibrated multiple of the replays' spread, by parameters sharded (FSDP/ZeRO-3)
#: (``benchmarks/accuracy.py --calibrate``, rerun after FSDP2's reserved became a whole-step
#: replay of its real buffers: unsharded runs' multiple went from 1 to 2, the smallest with every
#: level covering 95%; before the replay gained FSDP's streams: {False: 2.0, True: 6.0}). Rerun
#: after the in-backward optimizer step, context parallel's ring attention and prompt tuning's
#: virtual tokens (issue 20) lifted three reserved points that had been more than 10% under:
#: {False: 2.0, True: 2.0} -> {False: 1.0, True: 1.5}, every level still covering 95%. Rerun after one GPU's
#: reserved gained the opt-in whole-step replay (reserved_replay): unchanged; and after the replay became
#: one GPU's default (the H200 battery, 2026-11-27): unchanged.
ALLOCATOR_SPREAD_SCALE: Final = {False: 1.0, True: 1.5}
#: Largest cited value above the one used, per runtime part (bytes; estimate/runtime.py sources):
#: the context none (the 758 MiB measured on an H200 after a training step is above every cited
#: figure; it was 124 MiB while the context was 512 MiB, up to eager loading's 667 MB); a communicator up to the
#: "about 1.6GB" of one all-reducing communicator (NVIDIA/nccl#864); vLLM's non-torch memory up
#: to the 1.79 GiB its V0 profiler logged where V1 logs 0.16-0.20 GiB (vllm-project/vllm#10511, #12126).
RUNTIME_SPREAD: Final = {
    "cuda_context": 0,
    "nccl_per_communicator": 950 * MiB,
    "cuda_context_and_kernels": 0,
}
_RULES = (Category.ACTIVATIONS, Category.TEMPORARY, Category.INPUTS)
#: Each margin's source (the same text for every estimate).
_RULES_SOURCE = f"{RULES_FRACTION:.0%} of activations, temporaries and inputs (calibrated, benchmarks/accuracy.py)"
_NOISE_SOURCE = f"{NOISE_FRACTION:.0%} of allocated (calibrated, benchmarks/accuracy.py)"
_ALLOCATOR_SOURCES = {
    sharded: f"{scale:g} x the replays' upper quartile above the fitted slack "
    "(benchmarks/allocator_fit.py; multiple calibrated, benchmarks/accuracy.py)"
    for sharded, scale in ALLOCATOR_SPREAD_SCALE.items()
}
_RUNTIME_SOURCE = "largest cited value of each runtime part above the one used (estimate/runtime.py)"


def safe_levels(
    *,
    allocated: int,
    reserved: int,
    device: int,
    breakdown: Mapping[Category, int],
    allocator_spread: int,
    runtime_spread: int,
    pool_bytes: int = 0,
    sharded: bool = False,
) -> SafeLevels:
    """The safe figure of each level: the point plus the margins of the terms it contains
    (a level contains the levels below it). ``allocator_spread`` and ``runtime_spread`` are the
    reserved and device margins in bytes (``TrainingSlack.spread_bytes`` or
    :func:`vramlens.estimator.reserved.generation_spread`, and :func:`runtime_spread`).
    ``pool_bytes``: a pre-allocated KV pool (vLLM), sized by the engine, which carries no noise;
    ``sharded``: parameters sharded by FSDP/ZeRO-3 (``ALLOCATOR_SPREAD_SCALE``)."""
    rules = int(RULES_FRACTION * sum([breakdown.get(category, 0) for category in _RULES]))
    allocator_spread = int(ALLOCATOR_SPREAD_SCALE[sharded] * allocator_spread)
    noise = int(NOISE_FRACTION * (allocated - pool_bytes))
    margins = (
        _margin(kind="framework rules", level="allocated", bytes=rules, source=_RULES_SOURCE),
        _margin(kind="data noise", level="allocated", bytes=noise, source=_NOISE_SOURCE),
        _margin(
            kind="modelled allocator", level="reserved", bytes=allocator_spread, source=_ALLOCATOR_SOURCES[sharded]
        ),
        _margin(kind="measured constants", level="device", bytes=runtime_spread, source=_RUNTIME_SOURCE),
    )
    safe_allocated = allocated + rules + noise
    safe_reserved = reserved + rules + noise + allocator_spread
    return _safe(
        allocated_bytes=safe_allocated,
        reserved_bytes=safe_reserved,
        device_bytes=device + (safe_reserved - reserved) + runtime_spread,
        margins=margins,
    )


#: :class:`Margin` and :class:`SafeLevels` made as their ``__init__`` would, faster (one of each per estimate).
_margin, _safe = maker(Margin), maker(SafeLevels)


def runtime_spread(runtime: Mapping[str, int], communicators: int) -> int:
    """Device-level margin: each runtime part's largest cited value above the one used."""
    spread = RUNTIME_SPREAD["cuda_context"] if "cuda_context" in runtime else 0
    return spread + communicators * RUNTIME_SPREAD["nccl_per_communicator"]
