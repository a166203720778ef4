"""What an RLHF step runs: the algorithm, its models (roles), the rollout engine and the GPUs.

A :class:`RlhfSetup` is plain data, validated when built; :func:`vramlens.rlhf.load_rlhf`
builds one from a YAML file or a dict (filling the defaults of the algorithm) and every
error is a one-line :class:`~vramlens.errors.InputError` naming the field and what it accepts.

Token counts: ``prompt`` and ``response`` are tokens per sequence; ``rollout_batch`` is
prompts per step over all GPUs of the rollout; ``micro_batch`` is sequences per GPU in one
forward or forward+backward of the scoring and training phases (DPO doubles it: a pair).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vramlens._compat import StrEnum
from vramlens._untrusted import brief
from vramlens.errors import InputError
from vramlens.workload.options import Engine, Method, Offload, OptimizerName, Precision, Quant, Recompute, Shard
from vramlens.workload.ranges import NumberRange, check_range

__all__ = ["ROLES", "TRAINED_ROLES", "Algo", "ModelRole", "Placement", "RlhfSetup", "RolloutSetup"]


class Algo(StrEnum):
    """The RLHF/preference algorithm (which models it runs, see :mod:`vramlens.rlhf.phases`)."""

    PPO = "ppo"
    GRPO = "grpo"
    DPO = "dpo"
    RLOO = "rloo"
    ONLINE_DPO = "online-dpo"


class Placement(StrEnum):
    """Where a model lives between the phases that run it."""

    COLOCATED = "colocated"
    """On the shared GPUs all step long."""
    OFFLOAD = "offload"
    """On the shared GPUs only while a phase needs it, on CPU otherwise (sleep/wake)."""
    SEPARATE = "separate"
    """On its own GPU group (disaggregated), all step long."""


#: Every role a step can have; the rollout is the generation engine (not a model of its own
#: for HF generate, which runs the actor's weights).
ROLES: tuple[str, ...] = ("actor", "critic", "reward", "reference", "rollout")
#: Roles whose models are trained (gradients, optimizer state).
TRAINED_ROLES: tuple[str, ...] = ("actor", "critic")


def _check_enum(enum: type[StrEnum], where: str, value: str) -> None:
    accepted = [member.value for member in enum]
    if value not in accepted:
        raise InputError(f"{where}: {brief(value)} is not one of {', '.join(accepted)}")


#: The workload key whose range (:data:`vramlens.workload.ranges.RANGES`) bounds each numeric
#: setting of a step (group_size and rollout_batch count sequences, as batch does).
_RANGE_OF = {
    "gpus": "parallel.gpus", "tp": "parallel.tp", "lora_rank": "lora.rank", "prompt": "prompt", "response": "prompt",
    "rollout_batch": "batch", "micro_batch": "batch", "group_size": "batch", "max_num_seqs": "max_num_seqs",
}  # fmt: skip
#: Host-to-GPU bandwidth accepted, GB/s (PCIe 5.0 x16 moves 64 GB/s, NVLink-C2C 900 GB/s).
PCIE_GBPS_RANGE = NumberRange(low=0, high=10_000, low_open=True)


def _check_positive(where: str, value: int | float) -> None:
    """A count or rate of the step: finite, positive and within its range (module tables)."""
    setting = where.rsplit(".", 1)[-1]
    if setting == "pcie_gbps":
        check_range(where, value, kind="a number of GB/s", bounds=PCIE_GBPS_RANGE)
    else:
        check_range(where, value, table_key=_RANGE_OF[setting])


@dataclass(frozen=True, kw_only=True)
class ModelRole:
    """One model of the step: its spec, precision, training method and parallelism."""

    role: str
    """"actor", "critic", "reward" or "reference"."""
    model: str
    """Catalog name, path to a config.json or model dir, or HF id in the local cache."""
    precision: str = Precision.MIXED_BF16.value
    method: str = Method.FULL.value
    """full | lora | qlora (trained roles); frozen roles run forward only."""
    lora_rank: int = 16
    quant: str = Quant.NONE.value
    """Weight quantization of a frozen model (or the qlora base)."""
    optimizer: str = OptimizerName.ADAMW.value
    recompute: str = Recompute.NONE.value
    tp: int = 1
    shard: str = Shard.NONE.value
    cpu_offload: str = Offload.NONE.value
    """Trained roles: ZeRO-Offload while training (optimizer | optimizer+params on CPU), as
    ``parallel.offload`` of a workload; not the same as ``placement: offload``."""
    placement: Placement = Placement.COLOCATED
    gpus: int | None = None
    """GPUs of its own group (``placement: separate`` only)."""
    from_actor_base: bool = False
    """Reference only: the actor's LoRA base with the adapters disabled (no weights of its own)."""

    def __post_init__(self) -> None:
        if self.role not in ROLES[:4]:
            raise InputError(f"role: {self.role!r} is not one of {', '.join(ROLES[:4])}")
        where = self.role
        if not self.model:
            raise InputError(f"{where}.model: empty (a catalog name or a config path)")
        _check_enum(Precision, f"{where}.precision", self.precision)
        _check_enum(Method, f"{where}.method", self.method)
        _check_enum(Quant, f"{where}.quant", self.quant)
        _check_enum(OptimizerName, f"{where}.optimizer", self.optimizer)
        _check_enum(Recompute, f"{where}.recompute", self.recompute)
        _check_enum(Shard, f"{where}.shard", self.shard)
        _check_enum(Offload, f"{where}.cpu_offload", self.cpu_offload)
        _check_enum(Placement, f"{where}.placement", self.placement)
        _check_positive(f"{where}.tp", self.tp)
        _check_positive(f"{where}.lora_rank", self.lora_rank)
        _check_placement_gpus(where, self.placement, self.gpus)
        if self.method not in (Method.FULL, Method.LORA, Method.QLORA):
            raise InputError(f"{where}.method: {brief(self.method)} is not accepted (full, lora or qlora)")
        if self.from_actor_base and self.role != "reference":
            raise InputError(f"{where}.from_actor_base: only the reference can be the actor's LoRA base")

    @property
    def trained(self) -> bool:
        return self.role in TRAINED_ROLES


def _check_placement_gpus(where: str, placement: Placement, gpus: int | None) -> None:
    if placement is Placement.SEPARATE:
        if gpus is None:
            raise InputError(f"{where}.gpus: a separate model needs its GPU count (e.g. --separate {where}=2)")
        _check_positive(f"{where}.gpus", gpus)
    elif gpus is not None:
        raise InputError(f"{where}.gpus: only with placement separate (got placement {placement.value})")


@dataclass(frozen=True, kw_only=True)
class RolloutSetup:
    """The generation engine: HF generate on the actor's weights, or a vLLM-style engine."""

    engine: str = Engine.HF.value
    """hf | vllm."""
    gpu_memory_utilization: float = 0.5
    """vLLM: fraction of each GPU the engine may take (weights, KV pool, activations)."""
    tp: int = 1
    placement: Placement = Placement.COLOCATED
    gpus: int | None = None
    kv_dtype: str = "auto"
    max_num_seqs: int = 256

    def __post_init__(self) -> None:
        _check_enum(Engine, "rollout.engine", self.engine)
        _check_enum(Placement, "rollout.placement", self.placement)
        _check_positive("rollout.tp", self.tp)
        _check_positive("rollout.max_num_seqs", self.max_num_seqs)
        check_range(
            "rollout.gpu_memory_utilization",
            self.gpu_memory_utilization,
            kind="a number",
            table_key="gpu_memory_utilization",
        )
        _check_placement_gpus("rollout", self.placement, self.gpus)

    @property
    def own_weights(self) -> bool:
        """Whether the engine holds its own copy of the weights (vLLM, or any separate engine)."""
        return self.engine == Engine.VLLM or self.placement is Placement.SEPARATE


@dataclass(frozen=True, kw_only=True)
class RlhfSetup:
    """One RLHF step: algorithm, models, rollout engine, token counts, GPUs and PCIe link."""

    algo: Algo
    gpu: str
    """GPU name from the hardware table (or a size such as "80GiB")."""
    gpus: int = 1
    """GPUs in all (shared group plus the separate groups)."""
    actor: ModelRole
    critic: ModelRole | None = None
    reward: ModelRole | None = None
    """None: a rule-based (function) reward, no model."""
    reference: ModelRole | None = None
    rollout: RolloutSetup = field(default_factory=RolloutSetup)
    precomputed_ref_logprobs: bool = False
    group_size: int = 1
    """Responses sampled per prompt (GRPO's G, RLOO's k, 2 for online DPO, 1 for PPO)."""
    prompt: int = 1024
    response: int = 1024
    rollout_batch: int = 32
    micro_batch: int = 4
    pcie_gbps: float = 25.0
    """Host<->GPU bandwidth in GB/s (decimal) for offload transfers; 25 GB/s is a PCIe 4.0 x16
    link's usual pinned-memory rate (32 GB/s raw), conservative for PCIe 5.0."""
    assumptions: tuple[str, ...] = ()
    """Defaults the loader chose where the input was silent."""

    def __post_init__(self) -> None:
        _check_enum(Algo, "algo", self.algo)
        for name in ("gpus", "group_size", "prompt", "response", "rollout_batch", "micro_batch", "pcie_gbps"):
            _check_positive(name, getattr(self, name))
        if self.actor.role != "actor":
            raise InputError(f"actor: got a {self.actor.role} model where the actor goes")
        _check_algo_roles(self)
        _check_groups(self)

    def role(self, name: str) -> ModelRole | None:
        """The model of a role (None when the step has none); not for "rollout"."""
        if name not in ROLES[:4]:
            raise InputError(f"role: {name!r} is not one of {', '.join(ROLES[:4])}")
        model: ModelRole | None = getattr(self, name)
        return model

    @property
    def models(self) -> tuple[ModelRole, ...]:
        """The models present, in role order."""
        present = (self.actor, self.critic, self.reward, self.reference)
        return tuple(model for model in present if model is not None)

    @property
    def generates(self) -> bool:
        return self.algo is not Algo.DPO

    def placement_of(self, role: str) -> Placement:
        if role == "rollout":
            return self.rollout.placement
        model = self.role(role)
        return Placement.COLOCATED if model is None else model.placement

    def separate_groups(self) -> dict[str, int]:
        """Role -> GPUs of each separate group, in role order."""
        groups = {m.role: m.gpus for m in self.models if m.placement is Placement.SEPARATE and m.gpus}
        if self.generates and self.rollout.placement is Placement.SEPARATE and self.rollout.gpus:
            groups["rollout"] = self.rollout.gpus
        return groups

    @property
    def shared_gpus(self) -> int:
        """GPUs of the shared group (all GPUs minus the separate groups)."""
        return self.gpus - sum(self.separate_groups().values())


def _check_algo_roles(setup: RlhfSetup) -> None:
    algo = setup.algo
    if setup.critic is not None and algo is not Algo.PPO:
        raise InputError(f"critic: {algo.value} has no critic (only ppo trains one); remove the critic")
    if setup.reward is not None and algo is Algo.DPO:
        raise InputError("reward: dpo learns from preference pairs and has no reward model; remove the reward")
    if algo is Algo.DPO and setup.reference is None and not setup.precomputed_ref_logprobs:
        raise InputError(
            "reference: dpo needs a reference model or precomputed_ref_logprobs: true (--precomputed-ref-logprobs)"
        )
    if setup.precomputed_ref_logprobs and setup.reference is not None:
        raise InputError("precomputed_ref_logprobs: true needs no reference model (use --no-reference)")
    ref = setup.reference
    if ref is not None and ref.from_actor_base and setup.actor.method == Method.FULL:
        raise InputError("reference.from_actor_base: needs an actor trained with method lora or qlora")
    fixed = {Algo.PPO: 1, Algo.DPO: 1, Algo.ONLINE_DPO: 2}
    if algo in fixed and setup.group_size != fixed[algo]:
        raise InputError(
            f"group_size: {algo.value} samples {fixed[algo]} response(s) per prompt; "
            "group_size is set only for grpo and rloo"
        )


def _check_groups(setup: RlhfSetup) -> None:
    groups = setup.separate_groups()
    if not groups:
        return
    used = sum(groups.values())
    shared_roles = [m.role for m in setup.models if m.placement is not Placement.SEPARATE]
    if setup.generates and setup.rollout.own_weights and setup.rollout.placement is not Placement.SEPARATE:
        shared_roles.append("rollout")
    count = len(groups) + (1 if shared_roles else 0)
    listed = ", ".join(f"{role}={gpus}" for role, gpus in groups.items())
    if count > setup.gpus:
        raise InputError(
            f"separate: more model groups ({count}) than GPUs (gpus={setup.gpus}); accepted: at most one group per GPU"
        )
    if used > setup.gpus or (shared_roles and used >= setup.gpus):
        left = f", leaving none for {', '.join(shared_roles)}" if shared_roles else ""
        raise InputError(
            f"separate: the separate groups ({listed}) take {used} of gpus={setup.gpus}{left}; "
            "accepted: separate GPUs that sum to less than --gpus"
        )
