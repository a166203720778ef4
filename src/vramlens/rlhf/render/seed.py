"""The seed's model: the RLHF memory numbers of seed ``000_*``/``001_*`` (``memory_timeline.py``),
re-implemented from the seed's text so vramlens can be compared with it (issue 9).

Nothing here is vramlens' estimate: these are the seed's own simplified formulas, kept as they
are, mistakes included, so the comparison in ``docs/rlhf.md`` and
``benchmarks/rlhf_seed_comparison.py`` shows what each simplification costs. The seed's formulas,
in decimal GB (1 GB = 10**9 bytes, as the seed prints):

* weights: ``params * 2`` (bf16) for **every** model, each the actor's size;
* KV cache: ``2 * layers * hidden * 2 bytes`` per token (K and V at the full hidden size: no GQA)
  times ``batch * seq`` (every sequence at its full length);
* gradients: ``params * 2``; Adam: ``params * 4 * 2`` (m and v in fp32; no fp32 master weights),
  counted **once** although the actor and the critic are both trained;
* activations: ``batch * seq * hidden * 10 * 2 bytes * layers`` ("~10x hidden per layer"), the
  whole batch at once (no micro-batches, no recomputation); scoring takes 0.2 of that;
* a flat 2 GB of "misc (buffers)" during generation.

The script itself prints whole-model numbers and compares them with one GPU's memory; its
example output divides the weights by TP=8 for the 70B model on 8x80 GB. :func:`seed_per_gpu`
does the same to every term (per GPU, the seed's way: divided by TP, misc kept whole), and
:data:`SEED_EXAMPLE` keeps the example output's own printed numbers, which do not all follow
from the formulas (e.g. its KV cache and activations).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vramlens.rlhf import RlhfPhase, RlhfReport

__all__ = [
    "SEED_EXAMPLE",
    "SEED_SETUP",
    "SEED_SWAPPED_SETUP",
    "ComparisonRow",
    "compare_with_seed",
    "SEED_MODELS",
    "SeedModel",
    "SeedScenario",
    "seed_per_gpu",
    "seed_phase_memory",
]

_GB = 1e9


@dataclass(frozen=True, kw_only=True, slots=True)
class SeedModel:
    """A row of the seed's ``MODELS`` table."""

    name: str
    params_billions: float
    hidden_size: int
    num_layers: int
    vocab_size: int = 128000


#: The seed's ``MODELS`` table, verbatim.
SEED_MODELS: dict[str, SeedModel] = {
    "7b": SeedModel(name="7B", params_billions=7, hidden_size=4096, num_layers=32),
    "13b": SeedModel(name="13B", params_billions=13, hidden_size=5120, num_layers=40),
    "70b": SeedModel(name="70B", params_billions=70, hidden_size=8192, num_layers=80),
    "405b": SeedModel(name="405B", params_billions=405, hidden_size=16384, num_layers=126),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class SeedScenario:
    """The seed's example: 70B on 8 GPUs of 80 GB, TP=8, batch 32 (sequence: the script's
    default, 2048 tokens)."""

    model: str = "70b"
    batch: int = 32
    seq: int = 2048
    gpus: int = 8
    tp: int = 8
    gpu_gb: float = 80.0


#: The example output's printed numbers (GB per GPU), as the seed shows them.
SEED_EXAMPLE: dict[str, dict[str, float]] = {
    "generation": {
        "actor weights": 17.5,
        "reference weights": 17.5,
        "reward weights": 17.5,
        "KV cache": 20.0,
        "total": 72.5,
    },
    "training": {
        "actor weights": 17.5,
        "critic weights": 17.5,
        "actor gradients": 17.5,
        "critic gradients": 17.5,
        "Adam states": 70.0,
        "activations": 10.0,
        "total": 150.5,
        "total with optimizer offload": 80.0,
    },
}


def _weights(model: SeedModel) -> float:
    return model.params_billions * 1e9 * 2 / _GB


def _kv(model: SeedModel, batch: int, seq: int) -> float:
    return batch * seq * 2 * model.num_layers * model.hidden_size * 2 / _GB


def _activations(model: SeedModel, batch: int, seq: int) -> float:
    return batch * seq * model.hidden_size * 10 * 2 * model.num_layers / _GB


def seed_phase_memory(model: SeedModel, batch: int, seq: int, phase: str) -> dict[str, float]:
    """The seed's ``calculate_phase_memory`` (whole models, GB) for ``generation``, ``scoring``
    or ``training``, with the seed's item names."""
    weights = _weights(model)
    if phase == "generation":
        return {
            "actor weights": weights,
            "KV cache": _kv(model, batch, seq),
            "reward weights": weights,
            "reference weights": weights,
            "misc (buffers)": 2.0,
        }
    if phase == "scoring":
        return {"reward weights": weights, "activations": _activations(model, batch, seq) * 0.2}
    if phase == "training":
        return {
            "actor weights": weights,
            "critic weights": weights,
            "actor gradients": weights,
            "critic gradients": weights,
            "Adam states": model.params_billions * 1e9 * 4 * 2 / _GB,
            "activations": _activations(model, batch, seq),
        }
    raise ValueError(f"phase: {phase!r}; the seed has generation, scoring, training")


def seed_per_gpu(scenario: SeedScenario | None = None) -> dict[str, dict[str, float]]:
    """The seed's formulas per GPU for ``scenario`` (the seed's example by default): every term
    divided by TP as the example does for the weights, the flat 2 GB misc kept whole; each
    phase gets a ``total``."""
    scenario = scenario or SeedScenario()
    model = SEED_MODELS[scenario.model]
    out: dict[str, dict[str, float]] = {}
    for phase in ("generation", "scoring", "training"):
        items = {
            name: value if name.startswith("misc") else value / scenario.tp
            for name, value in seed_phase_memory(model, scenario.batch, scenario.seq, phase).items()
        }
        items["total"] = sum(items.values())
        out[phase] = items
    return out


# -- side by side with vramlens ---------------------------------------------------------------


#: The seed's scenario as a vramlens RLHF setup (``load_rlhf``): PPO with four Llama-3.1-70B
#: models (hidden 8192, 80 layers: the seed's 70B row, with its real 8 KV heads and 128256
#: vocab), every model TP=8 on 8 H100 80GB, HF generate, 32 prompts of 1024 + 1024 tokens
#: (the seed's batch 32 x 2048), everything colocated (the seed keeps its models resident).
SEED_SETUP: dict[str, object] = {
    "algo": "ppo",
    "actor": "llama-3.1-70b",
    "critic": "llama-3.1-70b",
    "reward": "llama-3.1-70b",
    "reference": "llama-3.1-70b",
    "gpu": "h100-80gb",
    "gpus": 8,
    "tp": 8,
    "prompt": 1024,
    "response": 1024,
    "rollout_batch": 32,
}


#: The seed's own way out, in vramlens: every model offloaded to CPU between its phases (the
#: seed's "phase-based swapping"), the actor's and the critic's optimizer states on CPU (the
#: seed's "with optimizer offload"; ZeRO-3 with CPU offload, which vramlens requires for it),
#: and micro-batches of 1 sequence.
SEED_SWAPPED_SETUP: dict[str, object] = {
    **SEED_SETUP,
    "offload": ["actor", "critic", "reward", "reference"],
    "micro_batch": 1,
    "actor": {"model": "llama-3.1-70b", "shard": "zero3", "cpu_offload": "optimizer"},
    "critic": {"model": "llama-3.1-70b", "shard": "zero3", "cpu_offload": "optimizer"},
}


@dataclass(frozen=True, kw_only=True, slots=True)
class ComparisonRow:
    """One line of the side-by-side table, decimal GB per GPU (None: the source has no such item)."""

    phase: str
    item: str
    seed_example: float | None
    seed_formulas: float | None
    vramlens: float | None
    """:data:`SEED_SETUP` as the seed describes it (everything resident)."""
    vramlens_swapped: float | None
    """:data:`SEED_SWAPPED_SETUP` (the seed's swapping and optimizer offload)."""


def _model_gb(phase: RlhfPhase | None, role: str, *categories: str) -> float | None:
    """GB of ``categories`` (all of the model's bytes when none given) a role holds in ``phase``."""
    if phase is None:
        return None
    if role not in phase.models or phase.models[role].where != "gpu":
        return 0.0
    state = phase.models[role]
    if not categories:
        return state.bytes / _GB
    return sum(int(state.breakdown.get(category, 0)) for category in categories) / _GB


def _phase_gb(phase: RlhfPhase | None, *categories: str) -> float | None:
    if phase is None:
        return None
    return sum(int(phase.breakdown.get(category, 0)) for category in categories) / _GB


_REST = ("activations", "temporary", "other", "inputs", "buffers")
#: (phase, item, the seed's item, how vramlens' number is read from the phase).
_ITEMS: tuple[tuple[str, str, str | None, Callable[[RlhfPhase | None], float | None]], ...] = (
    ("generation", "actor weights", "actor weights", lambda p: _model_gb(p, "actor", "parameters")),
    ("generation", "reference weights", "reference weights", lambda p: _model_gb(p, "reference", "parameters")),
    ("generation", "reward weights", "reward weights", lambda p: _model_gb(p, "reward", "parameters")),
    ("generation", "critic (all it holds)", None, lambda p: _model_gb(p, "critic")),
    ("generation", "actor optimizer state (resident)", None, lambda p: _model_gb(p, "actor", "optimizer_state")),
    ("generation", "KV cache", "KV cache", lambda p: _phase_gb(p, "kv_cache")),
    ("generation", "misc / activations", "misc (buffers)", lambda p: _phase_gb(p, *_REST)),
    ("scoring", "reward weights", "reward weights", lambda p: _model_gb(p, "reward", "parameters")),
    ("scoring", "activations", "activations", lambda p: _phase_gb(p, *_REST, "kv_cache")),
    ("scoring", "other models (resident)", None, lambda p: _others(p, "reward")),
    ("training", "actor weights", "actor weights", lambda p: _model_gb(p, "actor", "parameters")),
    ("training", "critic weights", "critic weights", lambda p: _model_gb(p, "critic", "parameters")),
    ("training", "actor gradients", "actor gradients", lambda p: _model_gb(p, "actor", "gradients")),
    ("training", "critic gradients", "critic gradients", lambda p: _model_gb(p, "critic", "gradients")),
    ("training", "Adam states", "Adam states", lambda p: _phase_gb(p, "optimizer_state")),
    ("training", "activations", "activations", lambda p: _phase_gb(p, *_REST)),
    ("training", "reward + reference (resident)", None, lambda p: _sum(_model_gb(p, "reward"), _model_gb(p, "reference"))),
)  # fmt: skip


def _others(phase: RlhfPhase | None, role: str) -> float | None:
    """GB the phase holds besides ``role``."""
    if phase is None:
        return None
    return (phase.allocated_bytes - (phase.models[role].bytes if role in phase.models else 0)) / _GB


def _sum(*values: float | None) -> float | None:
    return None if any(value is None for value in values) else sum(value or 0.0 for value in values)


def _seed_phases(report: RlhfReport) -> dict[str, RlhfPhase | None]:
    """vramlens' phases that stand for the seed's three: its training is the actor's."""
    phases = {phase.name: phase for phase in report.phases}
    return {"generation": phases.get("generation"), "scoring": phases.get("scoring"),
            "training": phases.get("actor_training")}  # fmt: skip


def compare_with_seed(
    report: RlhfReport, swapped: RlhfReport, scenario: SeedScenario | None = None
) -> tuple[ComparisonRow, ...]:
    """The seed's example, the seed's formulas (per GPU, :func:`seed_per_gpu`), vramlens' ``report``
    of :data:`SEED_SETUP` and ``swapped`` of :data:`SEED_SWAPPED_SETUP`, item by item, then each
    phase's allocated total. The seed's one training phase is compared with vramlens' actor training."""
    formulas, example = seed_per_gpu(scenario), SEED_EXAMPLE
    plain, moved = _seed_phases(report), _seed_phases(swapped)
    rows = [
        ComparisonRow(
            phase=phase,
            item=item,
            seed_example=example.get(phase, {}).get(seed_key) if seed_key else None,
            seed_formulas=formulas[phase].get(seed_key, 0.0) if seed_key else None,
            vramlens=read(plain[phase]),
            vramlens_swapped=read(moved[phase]),
        )
        for phase, item, seed_key, read in _ITEMS
    ]
    for name in ("generation", "scoring", "training"):
        one, two = plain[name], moved[name]
        rows.append(
            ComparisonRow(
                phase=name,
                item="total",
                seed_example=example.get(name, {}).get("total"),
                seed_formulas=formulas[name]["total"],
                vramlens=None if one is None else one.allocated_bytes / _GB,
                vramlens_swapped=None if two is None else two.allocated_bytes / _GB,
            )
        )
    return tuple(rows)
