"""Hand-made RLHF reports for the picture tests: real :mod:`vramlens.rlhf` dataclasses with
round numbers, so every bar, cell and label can be checked by hand (no engine involved)."""

from __future__ import annotations

from vramlens.rlhf.report import ModelState, RlhfPhase, RlhfReport, Transition
from vramlens.rlhf.setup import Algo, ModelRole, RlhfSetup
from vramlens.units import GiB

ROLES = ("actor", "critic", "reward", "reference")


def setup() -> RlhfSetup:
    """A PPO step of four small models on one GPU."""
    return RlhfSetup(
        algo=Algo.PPO,
        gpu="h100-80gb",
        actor=ModelRole(role="actor", model="llama-3.2-1b"),
        critic=ModelRole(role="critic", model="llama-3.2-1b"),
        reward=ModelRole(role="reward", model="llama-3.2-1b"),
        reference=ModelRole(role="reference", model="llama-3.2-1b"),
    )


def phase(name: str, gib: dict[str, int], busy: str, extra: dict[str, int], *, overhead: int = 2) -> RlhfPhase:
    """A phase holding ``gib[role]`` GiB per model plus ``extra`` GiB by category (e.g. KV cache),
    ``overhead`` GiB of allocator slack (half) and runtime (half); the models' own bytes count
    as parameters."""
    models = {
        role: ModelState(
            role=role, where="gpu" if gib.get(role) else "cpu", bytes=gib.get(role, 0) * GiB,
            breakdown={"parameters": gib.get(role, 0) * GiB}, busy=role == busy,
        )
        for role in ROLES
    }  # fmt: skip
    breakdown = {"parameters": sum(gib.values()) * GiB, **{k: v * GiB for k, v in extra.items()}}
    allocated = sum(breakdown.values())
    return RlhfPhase(
        name=name, allocated_bytes=allocated, reserved_bytes=allocated + overhead * GiB // 2,
        device_bytes=allocated + overhead * GiB, breakdown=breakdown, models=models, gpu_group="all", note=busy,
    )  # fmt: skip


def report(*, capacity_gib: int = 80, training_extra: int = 40) -> RlhfReport:
    """generation 10+10+10+10 GiB models + 20 KV = 60 (62 device); scoring 40 + 4 activations
    = 44 (46); actor training 40 + ``training_extra`` optimizer state (82 device by default)."""
    weights = dict.fromkeys(ROLES, 10)
    phases = (
        phase("generation", weights, "actor", {"kv_cache": 20}),
        phase("scoring", weights, "reward", {"activations": 4}),
        phase("actor_training", weights, "actor", {"optimizer_state": training_extra}),
    )
    peak = max(phases, key=lambda p: p.device_bytes)
    return RlhfReport(
        setup=setup(), phases=phases,
        transitions=(Transition(before="generation", after="scoring", role="actor", action="free", bytes=20 * GiB,
                                seconds=0.0),),
        peak_phase=peak.name, peak_allocated_bytes=peak.allocated_bytes, peak_reserved_bytes=peak.reserved_bytes,
        peak_device_bytes=peak.device_bytes, capacity_bytes=capacity_gib * GiB,
        fits=peak.device_bytes <= capacity_gib * GiB, recommendations=(), assumptions=("hand-made",),
    )  # fmt: skip
