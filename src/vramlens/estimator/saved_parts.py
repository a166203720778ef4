"""Building blocks of the activation count: saved-tensor parts, the layer recipe, and the
parts that norms, linear inputs and LoRA adapters keep (see :mod:`vramlens.estimator.activations`).

Units: bytes per token of one decoder layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.estimator.act_fns import activation_fn
from vramlens.model.modules import LinearShape, is_shared_expert
from vramlens.model.spec import ModelSpec
from vramlens.resolve.styles import HfStyle, NormStyle
from vramlens.workload.options import AttentionImpl

__all__ = [
    "FP32",
    "GATHERED",
    "HEADS",
    "MASK",
    "MLP_INPUT",
    "SEQUENCE",
    "STAT",
    "LayerRecipe",
    "Part",
    "TrainState",
    "QKV_NAMES",
    "fused_qkv_lora_parts",
    "gated_saved",
    "group_inputs",
    "lora_parts",
    "norm_saved",
    "plain_saved",
]

FP32 = 4
STAT = 4  # one fp32 statistic (rsqrt / rstd / mean) per token
MASK = 1  # a dropout mask element (bool on CUDA)


#: How tensor parallelism splits a saved tensor.
HEADS = "heads"
"""Split by heads or MLP columns: divided by tp."""
SEQUENCE = "sequence"
"""Hidden-size tensors between parallel regions: divided by tp only with sequence parallelism."""
GATHERED = "gathered"
"""Inputs of column-parallel linears: all-gathered to the full sequence, never divided."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Part:
    """One saved tensor (or family of tensors) of a layer, in bytes per token."""

    name: str
    bytes_per_token: float
    split: str = HEADS
    """How tensor parallelism divides it: HEADS, SEQUENCE or GATHERED."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainState:
    """What needs gradients inside a layer."""

    norms: bool
    """Norm weights are trained (full fine-tuning)."""
    needs_input: frozenset[str]
    """Linear modules whose input must be kept (trained weight or LoRA adapter)."""
    adapters: frozenset[str]
    """Linear modules carrying a LoRA adapter."""
    lora_rank: int = 0
    lora_dropout: float = 0.0
    adapter_bytes: int = 4
    experts_adapted: bool = False
    """PEFT's ``ParamWrapper`` adapts the MoE router weight and the 3-D experts (all-linear LoRA,
    :mod:`vramlens.estimator.expert_lora`): their merged weights need gradients, so the router and
    the experts' grouped matmuls keep their inputs as in full fine-tuning."""
    adapter_input_copies: bool = True
    """Each adapter keeps its own copy of its input (PEFT casts it to the adapter dtype). False
    for PEFT's bitsandbytes 4-bit layers under autocast (:mod:`vramlens.estimator.qlora`): the
    adapters read the input itself, which ``needs_input`` then keeps once per group."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerRecipe:
    """Everything the per-layer count depends on, resolved."""

    spec: ModelSpec
    style: HfStyle
    compute_bytes: int
    """Bytes of matmul outputs (2 for bf16/fp16, 4 for fp32)."""
    autocast: bool
    """fp32 residual stream and weights, bf16 matmuls (each linear casts its input)."""
    autocast_adapters: bool = False
    """An autocast region is active around bf16 weights (LoRA with mixed precision): adapters
    run their matmuls in bf16 and keep bf16 casts of their inputs."""
    attention: AttentionImpl
    math_unmasked: bool = False
    """The layers no mask reaches run SDPA's math backend: they keep what eager attention keeps
    (:attr:`vramlens.resolve.context.TrainingContext.math_unmasked`; :meth:`eager_like`)."""
    seq: int
    """Keys each query attends to in eager attention (the sequence length)."""
    linears: tuple[LinearShape, ...]
    train: TrainState
    fused_norm: bool = False
    """Norms keep only their input and one statistic (compiled / fused kernels)."""
    moe_capacity: float = 1.0
    """Expert buffers as a multiple of the routed tokens (1.0: dropless)."""
    fused_pointwise: bool = False
    """torch.compile: AOTAutograd's min-cut partitioner recomputes the activation function of a
    gated MLP from the kept gate output (gate, up and the down input stay: 3 intermediates
    instead of 4); a plain MLP keeps what eager keeps. Checked with saved-tensor hooks on a
    compiled layer (tests/estimator/test_compile_saved.py)."""
    training_cache: bool = False
    """The forward fills a KV cache (:attr:`HfStyle.training_cache`, the text config's ``use_cache``
    true, no gradient checkpointing), which holds every attention layer's keys and values."""
    linear_out_bytes: int = 0
    """Bytes per element of a frozen base linear's output when it is not ``compute_bytes``:
    bitsandbytes' 4-bit linears return their input's dtype, fp32 on a k-bit-prepared QLoRA
    model (:mod:`vramlens.estimator.qlora`). 0: ``compute_bytes``."""

    def eager_like(self, *, sliding: bool) -> bool:
        """A layer's attention keeps what eager attention keeps: eager attention, or SDPA's math
        backend in a layer no mask reaches (``sliding``: the layer's attention is masked)."""
        return self.attention is AttentionImpl.EAGER or (self.math_unmasked and not sliding)


def norm_saved(recipe: LayerRecipe, width: int, *, input_bytes: int, name: str) -> list[Part]:
    """Tensors one norm of ``width`` features keeps (see :class:`NormStyle`)."""
    trained = recipe.train.norms
    if recipe.fused_norm:
        return [
            Part(name=f"{name} input", bytes_per_token=input_bytes * width, split=SEQUENCE),
            Part(name=f"{name} rstd", bytes_per_token=STAT, split=SEQUENCE),
        ]
    style = recipe.style.norm
    if style == NormStyle.LAYERNORM:
        return [
            Part(name=f"{name} input", bytes_per_token=input_bytes * width, split=SEQUENCE),
            Part(name=f"{name} mean+rstd", bytes_per_token=2 * STAT, split=SEQUENCE),
        ]
    if style == NormStyle.COHERE:
        parts = [
            Part(name=f"{name} two fp32 centered copies (x - mean)", bytes_per_token=2 * FP32 * width, split=SEQUENCE),
            Part(name=f"{name} rsqrt", bytes_per_token=STAT, split=SEQUENCE),
        ]
        if trained:
            parts.append(Part(name=f"{name} fp32 normalized", bytes_per_token=FP32 * width, split=SEQUENCE))
        return parts
    parts = [
        Part(name=f"{name} fp32 input", bytes_per_token=FP32 * width, split=SEQUENCE),
        Part(name=f"{name} rsqrt", bytes_per_token=STAT, split=SEQUENCE),
    ]
    if style == NormStyle.TORCHTUNE:
        # The composite path (a scale that is not fp32) keeps the fp32 product for a trained scale.
        if trained and recipe.compute_bytes != FP32:
            parts.append(Part(name=f"{name} fp32 normalized", bytes_per_token=FP32 * width, split=SEQUENCE))
        return parts
    if trained:
        normalized = input_bytes if style == NormStyle.RMS else FP32
        parts.append(Part(name=f"{name} normalized", bytes_per_token=normalized * width, split=SEQUENCE))
    return parts


def group_inputs(recipe: LayerRecipe, group: str, width: int, *, input_bytes: int, gathered: bool) -> list[Part]:
    """Inputs kept by the linears of ``group`` (shared in pure precision, one cast each under autocast)."""
    needing = [s for s in recipe.linears if s.group == group and s.name in recipe.train.needs_input]
    if not needing:
        return []
    a = recipe.compute_bytes
    if recipe.autocast and input_bytes != a:
        return [
            Part(
                name=f"{s.name} input (autocast cast)", bytes_per_token=a * width, split=GATHERED if gathered else HEADS
            )
            for s in needing
        ]
    return [Part(name=f"{group} input", bytes_per_token=input_bytes * width, split=GATHERED if gathered else HEADS)]


MLP_INPUT = "mlp_in input"


def lora_parts(
    recipe: LayerRecipe, group: str, width: int, *, input_bytes: int, shared_expert: bool = False
) -> list[Part]:
    """PEFT adapters: each casts its input to the adapter dtype and keeps it, plus the rank-r output.
    Where no cast is needed (fp32 adapters on fp32 inputs) ``lora_A`` keeps the input itself, which
    the frozen base linear does not: once for the group (e.g. the norm's output before q and v;
    tracked fp32 PEFT runs, tests/estimator/test_training_hf.py).
    ``shared_expert``: the adapters of an MoE layer's shared expert, else the others of ``group``
    (``recipe.linears`` lists every layer kind's linears: a dense layer has no shared expert)."""
    train = recipe.train
    fused = recipe.style.lora_fused_qkv and group == "attn_in" and not shared_expert
    parts = fused_qkv_lora_parts(recipe, width, input_bytes=input_bytes) if fused else []
    uncast = False
    for shape in recipe.linears:
        if (
            shape.group != group
            or shape.name not in train.adapters
            or is_shared_expert(recipe.spec, shape) != shared_expert
            or (fused and shape.name in QKV_NAMES)
        ):
            continue
        autocast = recipe.autocast or recipe.autocast_adapters
        cast = recipe.compute_bytes if autocast else train.adapter_bytes
        # PEFT casts the input to the adapter dtype; under autocast lora_A casts it back to bf16:
        # either way each adapter keeps its own copy unless the dtypes already agree.
        if train.adapter_input_copies and (autocast or cast != input_bytes or train.lora_dropout > 0):
            parts.append(Part(name=f"{shape.name} adapter input", bytes_per_token=cast * width, split=SEQUENCE))
        else:
            uncast = train.adapter_input_copies
        if train.lora_dropout > 0:
            parts.append(Part(name=f"{shape.name} adapter dropout mask", bytes_per_token=MASK * width, split=SEQUENCE))
        parts.append(Part(name=f"{shape.name} lora_A output", bytes_per_token=cast * train.lora_rank, split=SEQUENCE))
    if uncast:
        parts.append(Part(name=f"{group} input (kept by lora_A)", bytes_per_token=input_bytes * width, split=SEQUENCE))
    return parts


#: The separate query, key and value projections that litgpt's ``LoRAQKVLinear`` adapts as one.
QKV_NAMES = ("q_proj", "k_proj", "v_proj")


def fused_qkv_lora_parts(recipe: LayerRecipe, width: int, *, input_bytes: int) -> list[Part]:
    """What litgpt's ``LoRAQKVLinear`` keeps when LoRA adapts some of q, k, v (:attr:`HfStyle.lora_fused_qkv`),
    in bytes per token of a ``width``-wide input:

    * ``lora_A`` (rank x adapted projections rows) reads the input once: the input itself, or one
      copy where a dropout (plus its mask) or an autocast cast sits in between;
    * its output, ``rank`` per adapted projection, read again by ``lora_B``'s ``conv1d``;
    * unless all three are adapted, ``zero_pad``'s ``index_copy_(-1, lora_ind, source)`` keeps its
      source, the ``lora_B`` outputs of the adapted projections (their output widths).

    Source: litgpt 0.5.13 ``lora.py`` (``LoRAQKVLinear.forward``, ``zero_pad``, ``conv1d``); checked
    with saved-tensor hooks on a tiny model on CPU (tests/estimator/test_litgpt.py). The per-layer
    ``lora_ind`` index (8 bytes per adapted output feature) is not per token: not counted."""
    train = recipe.train
    qkv = [s for s in recipe.linears if s.group == "attn_in" and s.name in QKV_NAMES]
    adapted = [s for s in qkv if s.name in train.adapters]
    if not adapted:
        return []
    autocast = recipe.autocast or recipe.autocast_adapters
    cast = recipe.compute_bytes if autocast else train.adapter_bytes
    parts = []
    if train.adapter_input_copies:  # else the group keeps its input once (``needs_input``)
        copy = autocast or cast != input_bytes or train.lora_dropout > 0
        name, per = (
            ("qkv adapter input (one lora_A)", cast) if copy else ("attn_in input (kept by lora_A)", input_bytes)
        )
        parts.append(Part(name=name, bytes_per_token=per * width, split=SEQUENCE))
    if train.lora_dropout > 0:
        parts.append(Part(name="qkv adapter dropout mask", bytes_per_token=MASK * width, split=SEQUENCE))
    rank = train.lora_rank * len(adapted)
    parts.append(Part(name="qkv lora_A output", bytes_per_token=cast * rank, split=SEQUENCE))
    if len(adapted) < len(qkv):
        padded = sum(s.out_features for s in adapted)
        parts.append(Part(name="qkv lora_B outputs kept by zero_pad (index_copy_)", bytes_per_token=cast * padded))
    return parts


def gated_saved(activation: str) -> int:
    """Tensors of the inner width a gated MLP (``down(act(gate(x)) * up(x))``) keeps up to the
    product: the activation function's own (:mod:`vramlens.estimator.act_fns`), its output and
    the up projection's output (the product keeps both factors). silu: gate, act, up = 3."""
    return activation_fn(activation).saved_inner + 2


def plain_saved(activation: str, *, down_keeps_input: bool) -> int:
    """Tensors of the inner width a plain MLP (``down(act(up(x)))``) keeps: the activation
    function's own, plus its output when the down projection keeps its input or the function
    differentiates through its result (relu: one tensor serves both)."""
    fn = activation_fn(activation)
    return fn.saved_inner + (1 if down_keeps_input or fn.saves_output else 0)
