"""Each model's memory per phase, from the analytic estimator (``vramlens.estimator``).

* Trained models (actor, critic): ``mode: train`` with the role's precision, method, optimizer,
  sharding and TP, ``batch = micro_batch`` (x2 for DPO pairs), ``seq = prompt + response``.
  Resident between phases: parameters, optimizer state and buffers (PyTorch frees gradients
  at ``zero_grad(set_to_none=True)``); the rest of the training peak is the phase's work.
* DPO is TRL's ``DPOTrainer`` (what people run for it): the policy trains with the ``trl``
  framework profile (TRL's fused LM head: chunked log-probs, no ``[tokens, vocab]`` logits;
  :mod:`vramlens.estimator.trl_head`), and the reference's log-probs come through the same
  fused head (``add_fused_lm_head(self.ref_model)``, trl/trainer/dpo_trainer.py, TRL 1.16).
* Forward-only passes (reward scoring, reference log-probs, critic values): ``mode: infer``
  prefill of ``micro_batch`` sequences of ``prompt + response`` tokens, no generated tokens.
  Log-prob passes add the logits of every position: ``tokens x vocab / tp x 2`` bytes
  (bf16), which a prefill's last-position logits leave out; DPO's reference adds TRL's fused
  head at its forward instead (the final hidden state's copy, one ``[4096, 32768]`` tile and
  its running statistics).
* The rollout: ``mode: infer`` of the actor's model with ``engine`` hf or vllm, the sequences
  of one data-parallel replica (``ceil(rollout_batch x group_size / (group GPUs / tp))``),
  ``prompt`` and ``generate = response``. HF generate borrows the actor's weights; vLLM keeps
  its own weights and pre-allocated KV pool (both resident while awake).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.estimator import estimate_resolved
from vramlens.estimator.trl_head import FusedHead, fused_head_memory
from vramlens.hardware import GpuSpec
from vramlens.model.params import parameter_breakdown
from vramlens.model.resolve import load_model
from vramlens.model.spec import ModelSpec
from vramlens.result.report import MemoryReport
from vramlens.rlhf.setup import Algo, ModelRole, Placement, RlhfSetup
from vramlens.workload.load import load_workload

__all__ = [
    "MOVABLE",
    "ModelMemory",
    "gathered_forward_bytes",
    "group_gpus",
    "group_of",
    "model_memories",
    "training_workload",
]

#: Categories a sleeping model copies to CPU (and back); the rest is freed and re-allocated.
MOVABLE: frozenset[Category] = frozenset({Category.PARAMETERS, Category.OPTIMIZER_STATE, Category.BUFFERS})
_SHARDED = ("zero3", "fsdp", "hsdp")


@dataclass(frozen=True, kw_only=True)
class ModelMemory:
    """One role's memory on each GPU of its group: what stays, and what each busy phase adds."""

    role: str
    group: str
    resident: Mapping[Category, int]
    """Held while the model is on the GPU (weights, optimizer state; vLLM's KV pool)."""
    work: Mapping[str, Mapping[Category, int]]
    """Phase name -> bytes added while that phase runs the model."""
    slack: Mapping[str, int]
    """Phase name -> allocator slack (reserved - allocated) of that phase's estimate."""
    runtime_bytes: int
    """Memory outside the allocator (CUDA context, cuBLAS, vLLM's CUDA graphs)."""
    kv_fits: bool | None = None
    """vLLM rollout: whether its KV pool holds the replica's sequences at once."""


def group_of(setup: RlhfSetup, role: str) -> str:
    """The GPU group of a role: its own when separate, else the shared one ("all" without groups)."""
    if setup.placement_of(role) is Placement.SEPARATE:
        return role
    borrows = (role == "rollout" and not setup.rollout.own_weights) or (
        role == "reference" and setup.reference is not None and setup.reference.from_actor_base
    )
    if borrows and role != "actor":
        return group_of(setup, "actor")
    return "shared" if setup.separate_groups() else "all"


def group_gpus(setup: RlhfSetup, group: str) -> int:
    if group in ("all", "shared"):
        return setup.shared_gpus
    return setup.separate_groups()[group]


def _tp(setup: RlhfSetup, role: str, tp: int) -> int:
    gpus = group_gpus(setup, group_of(setup, role))
    if gpus % tp:
        raise InputError(f"{role}.tp: {tp} does not divide the {gpus} GPU(s) of its group (accepted: a divisor)")
    return tp


def _split(report: MemoryReport, keep: frozenset[Category]) -> tuple[dict[Category, int], dict[Category, int]]:
    breakdown = report.peak.breakdown
    resident = {c: b for c, b in breakdown.items() if c in keep and b}
    work = {c: b for c, b in breakdown.items() if c not in keep and b}
    return resident, work


class _Estimator:
    """Runs the estimator for one setup, loading each model spec once."""

    def __init__(self, setup: RlhfSetup, gpu: GpuSpec) -> None:
        self.setup = setup
        self.gpu = gpu
        self.specs: dict[str, ModelSpec] = {}

    def spec(self, name: str) -> ModelSpec:
        if name not in self.specs:
            self.specs[name] = load_model(name)
        return self.specs[name]

    def run(self, role: str, name: str, workload: dict[str, Any]) -> MemoryReport:
        """The estimate of one role's pass; its workload errors name the role first."""
        spec = self.spec(name)
        try:
            loaded = load_workload({"model": spec, "gpu": self.gpu.name, **workload})
            return estimate_resolved(spec, loaded, self.gpu)
        except InputError as exc:
            raise InputError(f"{role} ({name}): {exc}") from None

    def train(self, role: ModelRole) -> MemoryReport:
        return self.run(role.role, role.model, training_workload(self.setup, role))

    def forward(self, role: ModelRole) -> MemoryReport:
        setup = self.setup
        pairs = 2 if setup.algo is Algo.DPO else 1
        tp = _tp(setup, role.role, role.tp)
        workload = {
            "mode": "infer", "precision": role.precision, "quant": role.quant, "batch": setup.micro_batch * pairs,
            "prompt": setup.prompt + setup.response, "generate": 0, "parallel": {"gpus": tp, "tp": tp},
        }  # fmt: skip
        if role.method == "qlora" and role.quant == "none":
            workload["quant"] = "nf4-dq"
        return self.run(role.role, role.model, workload)

    def rollout(self) -> MemoryReport:
        setup, rollout = self.setup, self.setup.rollout
        tp = _tp(setup, "rollout", rollout.tp)
        replicas = group_gpus(setup, group_of(setup, "rollout")) // tp
        sequences = math.ceil(setup.rollout_batch * setup.group_size / replicas)
        workload = {
            "mode": "infer", "precision": "bf16", "batch": sequences, "prompt": setup.prompt,
            "generate": setup.response, "engine": rollout.engine, "kv_dtype": rollout.kv_dtype,
            "gpu_memory_utilization": rollout.gpu_memory_utilization, "max_num_seqs": rollout.max_num_seqs,
            "parallel": {"gpus": tp, "tp": tp},
        }  # fmt: skip
        return self.run("rollout", setup.actor.model, workload)


def training_workload(setup: RlhfSetup, role: ModelRole) -> dict[str, Any]:
    """The ``mode: train`` workload (without model and GPU) of a trained role's training phase."""
    pairs = 2 if setup.algo is Algo.DPO else 1
    gpus = group_gpus(setup, group_of(setup, role.role))
    tp = _tp(setup, role.role, role.tp)
    shard = "ddp" if role.shard == "none" and gpus > tp else role.shard
    workload = {
        "mode": "train", "precision": role.precision, "method": role.method, "optimizer": role.optimizer,
        "recompute": role.recompute, "batch": setup.micro_batch * pairs, "seq": setup.prompt + setup.response,
        "lora": {"rank": role.lora_rank},
        "parallel": {
            "gpus": gpus, "tp": tp, "shard": shard, "offload": role.cpu_offload,
        },
    }  # fmt: skip
    if role.quant != "none":
        workload["quant"] = role.quant
    if setup.algo is Algo.DPO:
        workload["framework"] = "trl"  # DPOTrainer
    return workload


def _levels(report: MemoryReport) -> tuple[int, int]:
    return report.reserved_bytes - report.allocated_bytes, report.device_bytes - report.reserved_bytes


def _trained(est: _Estimator, role: ModelRole, phase: str) -> ModelMemory:
    report = est.train(role)
    resident, work = _split(report, MOVABLE)
    slack, runtime = _levels(report)
    works, slacks = {phase: work}, {phase: slack}
    if role.role == "critic":
        values = est.forward(role)
        works["values"] = _split(values, MOVABLE)[1]
        slacks["values"] = _levels(values)[0]
    group = group_of(est.setup, role.role)
    return ModelMemory(role=role.role, group=group, resident=resident, work=works, slack=slacks, runtime_bytes=runtime)


def _logits(est: _Estimator, role: ModelRole) -> int:
    """A log-prob forward's head, bytes: bf16 logits of every position (vocab split over TP), or
    for DPO TRL's fused head at its forward (:func:`vramlens.estimator.trl_head.fused_head_memory`:
    the scored positions drop each row's last one; no gradient, bf16 weights and hidden states)."""
    setup = est.setup
    pairs = 2 if setup.algo is Algo.DPO else 1
    rows = setup.micro_batch * pairs
    tokens = rows * (setup.prompt + setup.response)
    vocab = math.ceil(est.spec(role.model).vocab_size / role.tp)
    if setup.algo is not Algo.DPO:
        return tokens * vocab * 2
    head = FusedHead(
        positions=max(tokens - rows, 1), vocab=vocab, hidden=est.spec(role.model).hidden_size,
        compute_bytes=2, stream_bytes=2, weight_bytes=2, head_trains=False,
    )  # fmt: skip
    return fused_head_memory(head).forward_end


def gathered_forward_bytes(spec: ModelSpec, report: MemoryReport) -> int:
    """Weights a sharded (ZeRO-3/FSDP) forward-only pass holds whole on a GPU at once, bytes:
    the root (embedding, final norm, head: gathered from the first layer to the end of the
    forward, as in FSDP's root unit) and two decoder layers (the one computing and the next,
    prefetched). Bytes per element are those of ``report``, the unsharded forward on the
    role's TP ranks (its weights over every parameter: storage format, already split over TP).
    Assumes layers of equal size; the training estimator counts a root-wrapped model the same
    way (:mod:`vramlens.estimator.fsdp`)."""
    parts = parameter_breakdown(spec)
    layers = parts.layers
    root = parts.total - layers
    per_element = report.peak.breakdown.get(Category.PARAMETERS, 0) / max(parts.total, 1)
    return math.ceil((root + 2 * layers / max(spec.num_layers, 1)) * per_element)


def _frozen(est: _Estimator, role: ModelRole, phase: str) -> ModelMemory:
    setup = est.setup
    report = est.forward(role)
    resident, work = _split(report, MOVABLE)
    gpus = group_gpus(setup, group_of(setup, role.role))
    if role.shard in _SHARDED and gpus > role.tp:
        resident = {c: -(-b // (gpus // role.tp)) for c, b in resident.items()}
        if resident.get(Category.PARAMETERS):
            gathered = gathered_forward_bytes(est.spec(role.model), report)
            work[Category.TEMPORARY] = work.get(Category.TEMPORARY, 0) + gathered
    if role.from_actor_base:
        resident = {}
    if phase == "reference":
        work[Category.TEMPORARY] = work.get(Category.TEMPORARY, 0) + _logits(est, role)
    slack, runtime = _levels(report)
    return ModelMemory(
        role=role.role, group=group_of(setup, role.role), resident=resident,
        work={phase: work}, slack={phase: slack}, runtime_bytes=runtime,
    )  # fmt: skip


def _rollout(est: _Estimator) -> ModelMemory:
    report = est.rollout()
    own = est.setup.rollout.own_weights
    vllm = est.setup.rollout.engine == "vllm"
    keep = MOVABLE | {Category.KV_CACHE} if vllm else MOVABLE
    resident, work = _split(report, keep)
    if not own:
        resident = {}
    slack, runtime = _levels(report)
    fits = report.serving.fits if report.serving is not None else None
    return ModelMemory(
        role="rollout", group=group_of(est.setup, "rollout"), resident=resident,
        work={"generation": work}, slack={"generation": slack}, runtime_bytes=runtime, kv_fits=fits,
    )  # fmt: skip


def model_memories(setup: RlhfSetup, gpu: GpuSpec) -> dict[str, ModelMemory]:
    """Role -> its memory, for every role of the step (the rollout only if the step generates)."""
    est = _Estimator(setup, gpu)
    memories = {"actor": _trained(est, setup.actor, "actor_training")}
    if setup.critic is not None:
        memories["critic"] = _trained(est, setup.critic, "critic_training")
    if setup.reward is not None:
        memories["reward"] = _frozen(est, setup.reward, "scoring")
    if setup.reference is not None:
        memories["reference"] = _frozen(est, setup.reference, "reference")
    if setup.generates:
        memories["rollout"] = _rollout(est)
    return memories
