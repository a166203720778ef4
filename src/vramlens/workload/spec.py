"""``Workload``: how a model runs (the contract of ``shared/docs/WORKLOAD.md``).

Frozen, keyword-only dataclasses; every field carries its contract default. Use
:func:`vramlens.workload.load_workload` to build one from a dict, a YAML/JSON
file or CLI flags with full validation; constructing the dataclasses directly
checks value ranges and cross-field rules too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vramlens._untrusted import brief
from vramlens.errors import InputError
from vramlens.workload.options import (
    AttentionImpl,
    Engine,
    Framework,
    FsdpWrap,
    Kernels,
    KvDtype,
    LossImpl,
    Method,
    Mode,
    Offload,
    OptimizerImpl,
    OptimizerName,
    PipelineSchedule,
    Precision,
    Quant,
    Recompute,
    Shard,
)
from vramlens.workload.ranges import MAX_BATCH_TOKENS, check_range

if TYPE_CHECKING:
    from vramlens.model.spec import ModelSpec

__all__ = ["ALL_LINEAR", "LoraConfig", "Parallelism", "Workload"]

#: ``lora.targets`` value meaning every linear layer of the decoder (PEFT's "all-linear").
ALL_LINEAR = "all-linear"


#: Integer keys of :class:`Workload` with a range in :data:`vramlens.workload.ranges.RANGES`.
_INTEGER_KEYS = (
    "batch", "seq", "grad_accum", "recompute_every", "prompt", "generate", "context", "max_num_seqs", "block_size",
    "max_num_batched_tokens",
)  # fmt: skip


#: DeepSpeed ZeRO's sizes in :class:`Parallelism` (elements; None: the defaults of :mod:`vramlens.resolve.zero`).
_ZERO_SIZES = (
    "reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_param_persistence_threshold", "sub_group_size",
)  # fmt: skip
#: The sizes only ZeRO-3 reads.
_ZERO3_ONLY = frozenset(name for name in _ZERO_SIZES if name != "reduce_bucket_size")


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise InputError(message)


@dataclass(frozen=True, kw_only=True, slots=True)
class LoraConfig:
    """LoRA adapter settings (``lora:`` block)."""

    rank: int = 16
    """Adapter rank r: each adapted ``in -> out`` linear gains ``r*(in+out)`` parameters."""
    alpha: float = 32
    """Scaling numerator (alpha / r); no memory effect."""
    dropout: float = 0.0
    """Dropout on the adapter input; > 0 keeps a dropout mask and a dropped copy of the input."""
    targets: str | tuple[str, ...] = ALL_LINEAR
    """``all-linear`` or module names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, ...,
    and ``lm_head`` for the output projection, which ``all-linear`` leaves out as PEFT does)."""
    modules_to_save: tuple[str, ...] = ()
    """Modules trained in full beside the adapters (embed_tokens, lm_head)."""

    def __post_init__(self) -> None:
        check_range("lora.rank", self.rank)
        check_range("lora.alpha", self.alpha, kind="a number")
        check_range("lora.dropout", self.dropout, kind="a number")
        _check(
            self.targets == ALL_LINEAR or (isinstance(self.targets, tuple) and len(self.targets) > 0),
            "lora.targets: must be 'all-linear' or a non-empty list of module names",
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Parallelism:
    """How the run is spread over GPUs (``parallel:`` block).

    ``gpus = dp * tp * pp * cp``; data-parallel ranks ``dp`` are sharded over
    ``shard_degree`` ranks (all of ``dp`` unless HSDP or partial sharding).
    """

    gpus: int = 1
    """Total GPUs."""
    shard: Shard = Shard.NONE
    """Data-parallel strategy."""
    shard_degree: int | None = None
    """Ranks a shard group spans (HSDP / partial sharding); None = all data-parallel ranks."""
    tp: int = 1
    """Tensor-parallel degree (heads and MLP columns split; with sequence parallelism)."""
    pp: int = 1
    """Pipeline stages."""
    pp_schedule: PipelineSchedule = PipelineSchedule.ONE_F_ONE_B
    """Pipeline schedule (1F1B keeps up to ``pp`` micro-batches in flight on the first stage)."""
    cp: int = 1
    """Context-parallel degree (sequence split across ranks)."""
    ep: int = 1
    """Expert-parallel degree (experts split across ranks)."""
    offload: Offload = Offload.NONE
    """CPU offload of optimizer state (and parameters)."""
    reduce_bucket_size: int | None = None
    """DeepSpeed ZeRO's ``reduce_bucket_size`` (elements); None: what HF Trainer fills for ``auto``."""
    stage3_prefetch_bucket_size: int | None = None
    """DeepSpeed ZeRO-3's ``stage3_prefetch_bucket_size`` (elements); None: HF Trainer's ``auto``."""
    stage3_max_live_parameters: int | None = None
    """DeepSpeed ZeRO-3's ``stage3_max_live_parameters`` (elements); None: DeepSpeed's default."""
    stage3_max_reuse_distance: int | None = None
    """DeepSpeed ZeRO-3's ``stage3_max_reuse_distance`` (elements); None: DeepSpeed's default."""
    stage3_param_persistence_threshold: int | None = None
    """DeepSpeed ZeRO-3's ``stage3_param_persistence_threshold`` (elements); None: HF Trainer's ``auto``."""
    sub_group_size: int | None = None
    """DeepSpeed ZeRO-3's ``sub_group_size`` (elements); None: DeepSpeed's default."""

    def __post_init__(self) -> None:
        for name in ("gpus", "tp", "pp", "cp", "ep"):
            check_range(f"parallel.{name}", getattr(self, name))
        if self.shard_degree is not None:
            check_range("parallel.shard_degree", self.shard_degree)
        self._check_zero_sizes()
        model_parallel = self.tp * self.pp * self.cp
        _check(
            self.gpus % model_parallel == 0,
            f"parallel.gpus: {self.gpus} is not a multiple of tp*pp*cp = {self.tp}*{self.pp}*{self.cp} = {model_parallel}",
        )
        dp = self.gpus // model_parallel
        _check(
            dp == 1 or self.shard is not Shard.NONE,
            f"parallel.gpus: {self.gpus} GPUs leave {dp} data-parallel ranks after tp*pp*cp={model_parallel}, "
            "but parallel.shard is 'none'; choose ddp, zero1, zero2, zero3, fsdp or hsdp",
        )
        _check(
            (self.gpus // self.pp) % self.ep == 0,
            f"parallel.ep: {self.ep} does not divide the {self.gpus // self.pp} ranks of a pipeline stage",
        )
        if self.shard is Shard.HSDP:
            _check(
                self.shard_degree is not None,
                "parallel.shard_degree: required with shard 'hsdp' (ranks per shard group)",
            )
        if self.shard_degree is not None:
            _check(
                self.shard not in (Shard.NONE, Shard.DDP),
                f"parallel.shard_degree: applies to sharded strategies (zero1-3, fsdp, hsdp), not '{self.shard}'",
            )
            _check(
                self.shard_degree >= 1 and dp % self.shard_degree == 0,
                f"parallel.shard_degree: must divide the {dp} data-parallel ranks, got {self.shard_degree}",
            )
        _check(
            self.offload is Offload.NONE or self.shard not in (Shard.NONE, Shard.DDP),
            f"parallel.offload: '{self.offload}' needs a ZeRO or FSDP strategy (parallel.shard zero1-3, fsdp or hsdp)",
        )
        _check(
            self.offload is not Offload.OPTIMIZER_PARAMS or self.shard in (Shard.ZERO3, Shard.FSDP, Shard.HSDP),
            "parallel.offload: 'optimizer+params' needs parameter sharding (parallel.shard zero3, fsdp or hsdp)",
        )

    def _check_zero_sizes(self) -> None:
        """DeepSpeed's sizes: in range, and only under the ZeRO stage that reads them."""
        for name in _ZERO_SIZES:
            value = getattr(self, name)
            if value is None:
                continue
            check_range(f"parallel.{name}", value)
            stages = (Shard.ZERO3,) if name in _ZERO3_ONLY else (Shard.ZERO1, Shard.ZERO2, Shard.ZERO3)
            _check(
                self.shard in stages,
                f"parallel.{name}: a DeepSpeed ZeRO setting, read with parallel.shard "
                f"{' or '.join(str(s) for s in stages)}, not '{self.shard}'",
            )

    @property
    def dp(self) -> int:
        """Data-parallel ranks: ``gpus / (tp * pp * cp)``."""
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def shard_group(self) -> int:
        """Ranks over which sharded state is split (1 when nothing is sharded).

        Without ``shard_degree`` that is every data-parallel rank times the
        context-parallel ranks: context-parallel ranks hold the same parameters,
        and FSDP2 (torchtitan) and Megatron's distributed optimizer shard over both.
        """
        if self.shard in (Shard.NONE, Shard.DDP):
            return 1
        return self.shard_degree if self.shard_degree is not None else self.dp * self.cp


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One training or inference configuration. Every field has its contract default."""

    model: str | ModelSpec
    """Catalog name, path to config.json or model dir, cached HF id, or a ModelSpec."""
    mode: Mode = Mode.TRAIN
    gpu: str | None = None
    """A GPU from the hardware table, or a size such as "24GiB"; None: no fit check."""
    framework: Framework = Framework.AUTO
    method: Method = Method.FULL
    lora: LoraConfig = field(default_factory=LoraConfig)
    precision: Precision = Precision.MIXED_BF16
    quant: Quant = Quant.NONE
    float8: bool = False
    """float8 matmuls (torchao): transient casts, no change to stored state."""
    optimizer: OptimizerName = OptimizerName.ADAMW
    optimizer_impl: OptimizerImpl = OptimizerImpl.AUTO
    optimizer_in_backward: bool = False
    """Step each parameter as soon as its gradient is ready and free the gradient."""
    batch: int = 4
    """Micro-batch per data-parallel rank (training) or concurrent sequences (inference)."""
    seq: int = 2048
    """Tokens per sample (the longest one for padded variable-length data)."""
    grad_accum: int = 1
    packing: bool = False
    recompute: Recompute = Recompute.NONE
    recompute_every: int = 1
    """With full recompute: checkpoint every k-th layer."""
    attention: AttentionImpl = AttentionImpl.AUTO
    loss: LossImpl = LossImpl.AUTO
    compile: bool = False
    kernels: Kernels = Kernels.EAGER
    """Whose kernels run the layers (:class:`Kernels`). Added to the v1 contract by vramlens."""
    moe_capacity_factor: float | None = None
    """MoE expert capacity as a multiple of the evenly routed share (GShard/Switch, DeepSpeed
    and Megatron ``--moe-expert-capacity-factor``): expert buffers hold
    ``factor x tokens x k / experts`` tokens each. None: dropless routing (transformers,
    MegaBlocks, Megatron's default). Added to the v1 contract by vramlens."""
    parallel: Parallelism = field(default_factory=Parallelism)
    fsdp_wrap: FsdpWrap = FsdpWrap.AUTO
    """FSDP's units (``parallel.shard: fsdp | hsdp``; :class:`FsdpWrap`): ``auto`` is the framework's
    own. Added to the v1 contract by vramlens."""
    prompt: int = 1024
    generate: int = 256
    context: int | None = None
    """Inference: prompt + generated tokens (instead of prompt/generate)."""
    kv_dtype: KvDtype = KvDtype.AUTO
    engine: Engine = Engine.HF
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    block_size: int = 16
    max_num_batched_tokens: int | None = None
    """Inference: tokens per forward step (vLLM's chunked-prefill budget and profile-run size).
    None: the engine default (vLLM 8192; HF generate runs the whole prompt at once).
    Added to the v1 contract by vramlens."""
    allow_long_context: bool = False
    """Allow ``seq``/``context`` beyond the model's max_position_embeddings (RoPE scaling set up by the user)."""
    versions: tuple[tuple[str, str], ...] = ()
    """Library versions of the run, e.g. ``(("transformers", "4.35"),)`` (a mapping in files and
    dicts); a package left out is the installed one, else the current release
    (:mod:`vramlens.workload.versions` holds the behaviours that changed). Added to the v1
    contract by vramlens."""
    alloc_conf: str = ""
    """``PYTORCH_CUDA_ALLOC_CONF`` of the run (e.g. ``expandable_segments:True,max_split_size_mb:512``);
    empty: PyTorch's defaults. The reserved level replays the allocator under it. Checked by the
    loader against the keys PyTorch accepts. Added to the v1 contract by vramlens."""
    reserved_replay: bool = True
    """One-GPU training without offload: the reserved level replays every request of the whole step
    (every layer) through the caching-allocator model, as the simulator replays its recorded timeline
    (within 3% of it on the agreement set, within 1.2% of ``max_memory_reserved`` on every
    unquantized training run of the H200 battery, ``validation/measured/2026-11-27-h200``; 3-10 ms
    per estimate). False: the vocabulary-sized tensors are replayed and the layers' slack is a closed
    form fitted to such replays (about 0.15 ms, what the planner's search prunes with; up to 13%
    under the battery's checkpointed runs). Added to the v1 contract by vramlens."""

    def __post_init__(self) -> None:
        for name in _INTEGER_KEYS:
            value = getattr(self, name)
            if value is not None:
                check_range(name, value)
        for name in ("moe_capacity_factor", "gpu_memory_utilization"):
            value = getattr(self, name)
            if value is not None:
                check_range(name, value, kind="a number")
        tokens = self.batch * (self.seq if self.mode is Mode.TRAIN else self.total_context)
        _check(
            tokens <= MAX_BATCH_TOKENS,
            f"batch: {self.batch:,} sequences of {tokens // self.batch:,} tokens are {tokens:,} tokens in one "
            f"micro-batch, more than the {MAX_BATCH_TOKENS:,} (2**32) accepted",
        )
        _check(isinstance(self.alloc_conf, str), f"alloc_conf: must be a string, got {brief(self.alloc_conf)}")
        _check(
            isinstance(self.versions, tuple)
            and all(isinstance(p, tuple) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in self.versions),
            f"versions: must be (package, version) pairs, got {brief(self.versions)}",
        )
        _check(
            self.fsdp_wrap is FsdpWrap.AUTO or self.parallel.shard in (Shard.FSDP, Shard.HSDP),
            f"fsdp_wrap: '{self.fsdp_wrap}' applies to parallel.shard fsdp or hsdp, not '{self.parallel.shard}'",
        )
        _check(
            not (self.method is Method.FULL and self.quant is not Quant.NONE and self.mode is Mode.TRAIN),
            f"quant: full training of {self.quant} weights is not possible; use method lora/qlora or quant none",
        )

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step: micro-batch x grad_accum x data-parallel ranks."""
        return self.batch * self.grad_accum * self.parallel.dp

    @property
    def total_context(self) -> int:
        """Inference tokens per sequence: ``context`` or ``prompt + generate``."""
        return self.context if self.context is not None else self.prompt + self.generate
