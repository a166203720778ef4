"""Every workload key, declared once (:data:`KEYS`): what it holds, its one-line description,
its unit, its range, its CLI flag and since when it exists.

Generated from this table: the loader's converters (:mod:`vramlens.workload.load`), the range
table (:data:`vramlens.workload.ranges.RANGES`), the CLI's workload flags and their ``--help``
(:mod:`vramlens.cli.estimate`), the web API's JSON schema (:mod:`vramlens.web.schema`) and
``docs/workload.md`` (:mod:`vramlens.cli.contract_doc`). The typed record the engines read is
:class:`~vramlens.workload.spec.Workload` (with :class:`LoraConfig` and :class:`Parallelism`):
its fields give each key's Python type and default, and a test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from vramlens._compat import StrEnum
from vramlens.workload import options as o
from vramlens.workload._range import NumberRange

__all__ = ["KEYS", "Key", "Kind", "keys_of"]


class Kind(StrEnum):
    """What a key holds; it decides the converter, the flag and the schema."""

    TEXT = "text"
    MODEL = "model"
    GPU = "gpu"
    CHOICE = "choice"
    """One value of the key's enum (:attr:`Key.values`)."""
    SWITCH = "switch"
    """true or false; on the command line ``--name/--no-name``."""
    INT = "int"
    TOKENS = "tokens"
    """A token count: an integer, or text such as ``8k`` (= 8192)."""
    REAL = "real"
    NAMES = "names"
    """A list of module names (a comma-separated string on the command line)."""
    TARGETS = "targets"
    """``all-linear`` or a list of module names."""
    ALLOC_CONF = "alloc_conf"
    VERSIONS = "versions"


#: The version of the contract a key first appeared in: ``v1`` is shared/docs/WORKLOAD.md's
#: first version; a vramlens version marks a key vramlens added to it.
CONTRACT_V1: Final = "v1"
VRAMLENS_0_1: Final = "vramlens 0.1.0"


@dataclass(frozen=True, kw_only=True, slots=True)
class Key:
    """One workload key."""

    path: str
    """``batch``; ``lora.rank`` and ``parallel.gpus`` for the nested blocks."""
    kind: Kind
    help: str
    """One line: what the key is. The CLI's ``--help``, the docs and the web schema all show it."""
    values: type[Enum] | None = None
    """The enum of a :attr:`Kind.CHOICE` key."""
    range: NumberRange | None = None
    """Accepted numbers of an INT, TOKENS or REAL key."""
    nullable: bool = False
    """``null`` is accepted (and means what the help says)."""
    flag: str | None = ""
    """CLI flag without dashes; ``""``: the key's name with dashes (``lora-`` before LoRA keys);
    None: no flag (``model`` is the command's argument)."""
    unit: str = ""
    since: str = CONTRACT_V1

    def __post_init__(self) -> None:
        if (self.kind is Kind.CHOICE) != (self.values is not None):
            raise ValueError(f"workload key {self.path}: an enum goes with kind choice, and only there")
        if (self.kind in (Kind.INT, Kind.TOKENS, Kind.REAL)) != (self.range is not None):
            raise ValueError(f"workload key {self.path}: a numeric key has a range, and only it")

    @property
    def block(self) -> str:
        """``""`` for a top-level key, else ``lora`` or ``parallel``."""
        return self.path.rpartition(".")[0]

    @property
    def name(self) -> str:
        """The key's name inside its block."""
        return self.path.rpartition(".")[2]

    @property
    def flag_name(self) -> str | None:
        """The CLI flag without its dashes (None: no flag)."""
        if self.flag is None:
            return None
        if self.flag:
            return self.flag
        prefix = "lora-" if self.block == "lora" else ""
        return prefix + self.name.replace("_", "-")

    def accepted(self) -> str:
        """The accepted values in words: an enum's values, a range, or what the converter takes."""
        if self.values is not None:
            return " | ".join(str(member.value) for member in self.values)
        if self.range is not None:
            return self.range.describe()
        return _ACCEPTED.get(self.kind, "")


_ACCEPTED: Final = {
    Kind.SWITCH: "true | false",
    Kind.NAMES: "module names",
    Kind.TARGETS: "all-linear, or module names",
}
_TOKENS: Final = "2**24 tokens; the longest contexts of released models are 10M tokens"
_DEGREE: Final = "2**16; at most the GPUs of one job"


def _tokens(low: int) -> NumberRange:
    return NumberRange(low=low, high=2**24, why=_TOKENS)


def _elements(low: int) -> NumberRange:
    """A DeepSpeed ZeRO size in elements (its defaults are 5e8 and 1e9)."""
    return NumberRange(low=low, high=2**40, why="2**40 elements; DeepSpeed's defaults are 5e7 to 1e9")


def _degree() -> NumberRange:
    return NumberRange(low=1, high=2**16, why=_DEGREE)


C, S, I, T, R = Kind.CHOICE, Kind.SWITCH, Kind.INT, Kind.TOKENS, Kind.REAL  # noqa: E741
V01 = VRAMLENS_0_1

#: Every key of the workload contract, in the order of the docs and of ``--help``.
KEYS: Final[tuple[Key, ...]] = (
    Key(path="model", kind=Kind.MODEL, flag=None,
        help="catalog name, path to config.json or a model dir, cached HF id, or a ModelSpec"),
    Key(path="mode", kind=C, values=o.Mode, help="training or inference"),
    Key(path="gpu", kind=Kind.GPU, nullable=True,
        help="GPU name (h100-80gb, a100-80gb, rtx-4090, ...) or a size such as 24GiB; none: no fit check"),
    Key(path="framework", kind=C, values=o.Framework,
        help="the stack whose defaults the auto settings take (auto: hf for training)"),
    Key(path="method", kind=C, values=o.Method, help="what is trained"),
    Key(path="precision", kind=C, values=o.Precision,
        help="dtypes of weights, gradients and states (mixed: fp32 master weights + bf16/fp16 compute)"),
    Key(path="quant", kind=C, values=o.Quant, help="frozen base weights (QLoRA) or inference weights"),
    Key(path="float8", kind=S, help="float8 matmuls (torchao): transient casts, no change to stored state"),
    Key(path="optimizer", kind=C, values=o.OptimizerName, help="the optimizer"),
    Key(path="optimizer_impl", kind=C, values=o.OptimizerImpl,
        help="its step's implementation (auto: the framework's own)"),
    Key(path="optimizer_in_backward", kind=S, help="step and free each gradient as soon as backward produces it"),
    Key(path="batch", kind=I, unit="sequences",
        range=NumberRange(low=1, high=2**20, why="2**20 sequences per rank; real micro-batches are 1 to a few thousand"),
        help="micro-batch per data-parallel rank (training) or concurrent sequences (inference)"),
    Key(path="seq", kind=T, unit="tokens", range=_tokens(1),
        help="tokens per sample (the longest one for padded variable-length data)"),
    Key(path="grad_accum", kind=I, unit="micro-batches", help="gradient accumulation steps",
        range=NumberRange(low=1, high=2**20, why="2**20 micro-batches per optimizer step")),
    Key(path="packing", kind=S, help="sequences packed into full-length samples"),
    Key(path="recompute", kind=C, values=o.Recompute, help="activation checkpointing"),
    Key(path="recompute_every", kind=I, unit="layers", help="with full recompute: checkpoint every k-th layer",
        range=NumberRange(low=1, high=4096, why="no model has 4,096 layers")),
    Key(path="attention", kind=C, values=o.AttentionImpl, help="the attention kernel (auto: the framework's)"),
    Key(path="loss", kind=C, values=o.LossImpl, help="the loss path (auto: the framework's)"),
    Key(path="compile", kind=S, help="torch.compile (fused norms and pointwise ops)"),
    Key(path="kernels", kind=C, values=o.Kernels, since=V01,
        help="training: the layers' kernels, eager (the framework's modules) or liger (use_liger_kernel)"),
    Key(path="moe_capacity_factor", kind=R, nullable=True, since=V01,
        range=NumberRange(low=1.0, high=1024.0, why="GShard and Switch use 1 to 2"),
        help="MoE expert capacity as a multiple of the evenly routed share; none: dropless routing"),
    Key(path="fsdp_wrap", kind=C, values=o.FsdpWrap, since=V01,
        help="FSDP's units: root (FSDP1), split (FSDP2 as accelerate and torchtitan wrap it); auto: the framework's"),
    Key(path="prompt", kind=T, unit="tokens", range=_tokens(1), help="inference: prompt tokens"),
    Key(path="generate", kind=T, unit="tokens", range=_tokens(0), help="inference: generated tokens"),
    Key(path="context", kind=T, unit="tokens", range=_tokens(1), nullable=True,
        help="inference: prompt + generated tokens (instead of prompt and generate)"),
    Key(path="kv_dtype", kind=C, values=o.KvDtype, help="inference: KV cache dtype (auto: the compute dtype)"),
    Key(path="engine", kind=C, values=o.Engine, help="inference: transformers generate or vLLM"),
    Key(path="gpu_memory_utilization", kind=R, unit="fraction",
        range=NumberRange(low=0.01, high=1.0, why="a fraction of the GPU; below 1% nothing fits"),
        help="inference (vllm): fraction of the GPU to use"),
    Key(path="max_num_seqs", kind=I, unit="sequences", help="inference (vllm): concurrent sequences",
        range=NumberRange(low=1, high=2**20, why="vLLM's default is 256 (1,024 on large GPUs)")),
    Key(path="block_size", kind=I, unit="tokens", help="inference (vllm): KV block size",
        range=NumberRange(low=1, high=2**16, why="vLLM uses 8 to 256 tokens per block")),
    Key(path="max_num_batched_tokens", kind=T, unit="tokens", range=_tokens(1), nullable=True, since=V01,
        help="inference: tokens per forward step (none: the engine's default, vLLM 8192)"),
    Key(path="allow_long_context", kind=S, since=V01,
        help="allow seq or context beyond the model's max_position_embeddings (RoPE scaling set up by the user)"),
    Key(path="versions", kind=Kind.VERSIONS, since=V01,
        help="library versions of the run, e.g. transformers=4.35,vllm=0.6 (left out: installed, else current)"),
    Key(path="alloc_conf", kind=Kind.ALLOC_CONF, since=V01,
        help="PYTORCH_CUDA_ALLOC_CONF of the run, e.g. expandable_segments:True (empty: PyTorch's defaults)"),
    Key(path="reserved_replay", kind=S, since=V01,
        help="one-GPU training: reserved from a replay of the whole step's requests (3-10 ms; false: a fitted "
             "closed form, 20-90x faster, up to 13% low on real GPUs)"),
    Key(path="lora.rank", kind=I, help="adapter rank r",
        range=NumberRange(low=1, high=2**16, why="no hidden size reaches 65,536")),
    Key(path="lora.alpha", kind=R, help="scaling numerator (alpha / r); no memory effect",
        range=NumberRange(low=0, high=1e6, low_open=True, why="a scale (alpha / rank); typical 8 to 256")),
    Key(path="lora.dropout", kind=R, help="dropout on the adapter input (> 0 keeps a mask and a dropped copy)",
        range=NumberRange(low=0, high=1, high_open=True, why="a probability")),
    Key(path="lora.targets", kind=Kind.TARGETS,
        help="all-linear, or comma-separated module names (q_proj,v_proj,lm_head; all-linear leaves lm_head out)"),
    Key(path="lora.modules_to_save", kind=Kind.NAMES, flag="modules-to-save",
        help="comma-separated modules trained in full beside the adapters (embed_tokens,lm_head)"),
    Key(path="parallel.gpus", kind=I, unit="GPUs", help="total GPUs",
        range=NumberRange(low=1, high=2**20, why="2**20 GPUs; the largest clusters have ~10**5")),
    Key(path="parallel.shard", kind=C, values=o.Shard, help="data-parallel strategy"),
    Key(path="parallel.shard_degree", kind=I, unit="ranks", nullable=True,
        range=NumberRange(low=1, high=2**20, why="at most the GPUs"),
        help="ranks a shard group spans (HSDP); none: all data-parallel ranks"),
    Key(path="parallel.tp", kind=I, range=_degree(), help="tensor-parallel degree"),
    Key(path="parallel.pp", kind=I, range=_degree(), help="pipeline stages"),
    Key(path="parallel.pp_schedule", kind=C, values=o.PipelineSchedule, help="pipeline schedule"),
    Key(path="parallel.cp", kind=I, range=_degree(), help="context-parallel degree (sequence split across ranks)"),
    Key(path="parallel.ep", kind=I, range=_degree(), help="expert-parallel degree (experts split across ranks)"),
    Key(path="parallel.offload", kind=C, values=o.Offload, help="CPU offload of optimizer state (and parameters)"),
    Key(path="parallel.reduce_bucket_size", kind=I, unit="elements", nullable=True, since=V01, range=_elements(1),
        help="DeepSpeed ZeRO reduce_bucket_size; none: hidden_size**2, as HF Trainer fills auto"),
    Key(path="parallel.stage3_prefetch_bucket_size", kind=I, unit="elements", nullable=True, since=V01,
        range=_elements(0), help="DeepSpeed ZeRO-3 prefetch bucket (0: no prefetch); none: 0.9 x hidden_size**2 (HF auto)"),
    Key(path="parallel.stage3_max_live_parameters", kind=I, unit="elements", nullable=True, since=V01,
        range=_elements(0), help="DeepSpeed ZeRO-3: gathered parameters the prefetch stops at; none: 1e9 (DeepSpeed's)"),
    Key(path="parallel.stage3_max_reuse_distance", kind=I, unit="elements", nullable=True, since=V01,
        range=_elements(0), help="DeepSpeed ZeRO-3: a parameter reused within this many is kept gathered; none: 1e9"),
    Key(path="parallel.stage3_param_persistence_threshold", kind=I, unit="elements", nullable=True, since=V01,
        range=_elements(0), help="DeepSpeed ZeRO-3: tensors this small stay gathered; none: 10 x hidden_size (HF auto)"),
    Key(path="parallel.sub_group_size", kind=I, unit="elements", nullable=True, since=V01, range=_elements(1),
        help="DeepSpeed ZeRO-3: partition elements the optimizer steps at once; none: 1e9 (DeepSpeed's)"),
)  # fmt: skip


def keys_of(block: str) -> tuple[Key, ...]:
    """The keys of one block: ``""`` (top level), ``lora`` or ``parallel``."""
    return tuple(key for key in KEYS if key.block == block)
