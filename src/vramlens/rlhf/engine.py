"""``rlhf_estimate``: per-GPU memory of one RLHF step, phase by phase (pure Python, no torch)."""

from __future__ import annotations

from vramlens.hardware import resolve_gpu
from vramlens.rlhf.models import model_memories
from vramlens.rlhf.phases import step_phases
from vramlens.rlhf.placement import build_phases, build_transitions
from vramlens.rlhf.report import RlhfPhase, RlhfReport
from vramlens.rlhf.setup import RlhfSetup

__all__ = ["rlhf_estimate", "step_memory"]

#: What every report says about how it counts (the loader adds the defaults it chose).
ASSUMPTIONS: tuple[str, ...] = (
    "per GPU, on the busiest GPU of each phase; allocated/reserved/device as in vramlens estimate",
    "resident between phases: weights, optimizer state and buffers (gradients are freed after each step)",
    "critic and reward are counted with their base model's LM head (a value head replaces it in practice: "
    "an overestimate of vocab x hidden parameters)",
    "forward-only passes (scoring, reference, values) run micro_batch sequences of prompt + response tokens; "
    "reference log-probs add bf16 logits of every position (tokens x vocab / tp x 2 bytes)",
    "the actor's old log-probs forward (ppo) stays below its training phase and is not a phase of its own",
    "shard none on more GPUs than tp trains with DDP (weights and optimizer state replicated)",
    "one process per GPU: models on a GPU share one CUDA context (the largest runtime counts once)",
)


def step_memory(setup: RlhfSetup) -> tuple[tuple[RlhfPhase, ...], int]:
    """The phases of a step and the GPU capacity (no transitions, no recommendations)."""
    gpu = resolve_gpu(setup.gpu)
    phases = build_phases(setup, model_memories(setup, gpu), step_phases(setup))
    return phases, gpu.memory_bytes


def rlhf_estimate(setup: RlhfSetup, *, recommend: bool = True, plan: bool = False) -> RlhfReport:
    """Per-GPU memory of every phase of one step of ``setup``, its peak, transitions and
    (with ``recommend``) the changes that lower the peak, each re-estimated (a few ms).

    ``plan``: also ask the planner (:func:`vramlens.planner.cheapest_change`, ~0.1-0.5 s) for
    the cheapest change to a training phase that is the peak and does not fit; the CLI does.
    """
    gpu = resolve_gpu(setup.gpu)
    memories = model_memories(setup, gpu)
    plans = step_phases(setup)
    phases = build_phases(setup, memories, plans)
    peak = max(phases, key=lambda p: p.device_bytes)
    rollout = memories.get("rollout")
    notes = list(ASSUMPTIONS)
    if rollout is not None and rollout.kv_fits is False:
        notes.append(
            "rollout: the vLLM KV pool does not hold all of a replica's sequences at once; "
            "vLLM queues the rest (slower generation, same memory)"
        )
    fits = peak.device_bytes <= gpu.memory_bytes
    report = RlhfReport(
        setup=setup,
        phases=phases,
        transitions=build_transitions(setup, memories, plans),
        peak_phase=peak.name,
        peak_allocated_bytes=max(p.allocated_bytes for p in phases),
        peak_reserved_bytes=max(p.reserved_bytes for p in phases),
        peak_device_bytes=peak.device_bytes,
        capacity_bytes=gpu.memory_bytes,
        fits=fits,
        recommendations=(),
        assumptions=(*setup.assumptions, *notes),
    )
    if not recommend:
        return report
    from dataclasses import replace

    from vramlens.rlhf.recommend import recommendations

    return replace(report, recommendations=recommendations(report, plan=plan))
