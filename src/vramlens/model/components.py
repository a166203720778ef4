"""The parts of a :class:`~vramlens.model.spec.ModelSpec`: attention, MLP, MoE, norms, positions, layers.

* :class:`AttentionSpec` - heads, KV heads, head size, biases, QK-norm, and
  :class:`MlaSpec` for DeepSeek's multi-head latent attention.
* :class:`MlpSpec` - a dense feed-forward block (gated SwiGLU/GeGLU or plain).
* :class:`MoeSpec` - routed experts, shared experts and the router.
* :class:`LayerSpec` - what varies per layer: attention window (full or
  sliding) and whether the FFN is dense or MoE.
* :class:`NormSpec`, :class:`PositionSpec` - normalisation and positions.
* :class:`VisionSpec` - a multimodal model's vision tower and projector, with the
  :class:`TowerLinear` modules LoRA can target in them (defined in :mod:`vramlens.model.vision`).

Each is a frozen, keyword-only dataclass validated in ``__post_init__``; a bad
value raises :class:`~vramlens.errors.ConfigError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vramlens._compat import StrEnum
from vramlens.errors import ConfigError
from vramlens.model.vision import PROJECTOR, VISION_TOWER, TowerLinear, VisionSpec

__all__ = [
    "ATTENDING_MIXERS",
    "MAMBA_MIXERS",
    "PROJECTOR",
    "VISION_TOWER",
    "AttentionSpec",
    "FfnKind",
    "LayerKind",
    "LayerSpec",
    "MlaSpec",
    "MlpKind",
    "MixerKind",
    "MlpSpec",
    "MoeSpec",
    "NormKind",
    "NormSpec",
    "PositionKind",
    "PositionSpec",
    "QKNorm",
    "TowerLinear",
    "VisionSpec",
]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


class NormKind(StrEnum):
    """Normalisation layer kind."""

    RMSNORM = "rmsnorm"
    """RMSNorm: one weight vector (Llama, Qwen, Gemma, Mistral, DeepSeek, OLMo 2)."""
    LAYERNORM = "layernorm"
    """LayerNorm: weight, and a bias when ``NormSpec.bias`` (GPT-2, NeoX, Falcon, Phi, StarCoder2)."""


class MlpKind(StrEnum):
    """Feed-forward block kind."""

    GATED = "gated"
    """Three matrices: gate, up (h -> i) and down (i -> h); SwiGLU/GeGLU."""
    PLAIN = "plain"
    """Two matrices: up (h -> i) and down (i -> h) with one activation (GPT-2, NeoX, Falcon, Phi-2)."""


class PositionKind(StrEnum):
    """How positions enter the model."""

    ROPE = "rope"
    """Rotary embeddings: no parameters."""
    LEARNED = "learned"
    """A learned absolute position table of ``max_positions x hidden`` (GPT-2)."""
    ALIBI = "alibi"
    """ALiBi attention biases: no parameters (the bias tensor is an activation)."""
    NONE = "none"


class MixerKind(StrEnum):
    """What mixes tokens in a decoder layer."""

    ATTENTION = "attention"
    """Softmax self-attention (full, sliding-window or chunked): a KV cache per token."""
    LINEAR_ATTENTION = "linear_attention"
    """Linear attention with a recurrent state (gated DeltaNet): a state per sequence."""
    MAMBA = "mamba"
    """A selective state-space mixer (Mamba 1/2): convolution and SSM states per sequence."""
    ATTENTION_AND_MAMBA = "attention+mamba"
    """Attention and a Mamba mixer side by side on the same normed input, their outputs summed
    (Falcon-H1): a KV cache per token and a state per sequence in every layer."""
    NONE = "none"
    """No token mixer: the layer is only a feed-forward block (Nemotron-H's MLP/MoE blocks)."""


#: Mixers that include softmax attention (and so a KV cache, masks and an attention kernel).
ATTENDING_MIXERS = frozenset({MixerKind.ATTENTION, MixerKind.ATTENTION_AND_MAMBA})
#: Mixers that include a Mamba mixer (a convolution and an SSM state per sequence).
MAMBA_MIXERS = frozenset({MixerKind.MAMBA, MixerKind.ATTENTION_AND_MAMBA})


class FfnKind(StrEnum):
    """The feed-forward block of a decoder layer."""

    DENSE = "dense"
    """The dense MLP (``ModelSpec.mlp``)."""
    MOE = "moe"
    """The mixture of experts (``ModelSpec.moe``)."""
    NONE = "none"
    """No feed-forward block (Nemotron-H's mixer-only blocks)."""


class QKNorm(StrEnum):
    """Normalisation of queries and keys before attention."""

    NONE = "none"
    PER_HEAD = "per_head"
    """One norm of width ``head_dim`` shared by all heads, for q and for k (Qwen3, Gemma 3, Phi-2 qk_layernorm)."""
    PER_PROJECTION = "per_projection"
    """One norm over the whole q projection (heads x head_dim) and one over k (kv_heads x head_dim) (OLMo 2)."""
    L2 = "l2"
    """A parameter-free L2 norm of each q and k head, on rotary layers only (Llama 4 ``use_qk_norm``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NormSpec:
    """A normalisation layer's kind and whether it has a bias."""

    kind: NormKind = NormKind.RMSNORM
    """RMSNorm or LayerNorm."""
    bias: bool = False
    """LayerNorm with a learned bias (RMSNorm never has one)."""

    def __post_init__(self) -> None:
        _require(not (self.bias and self.kind is NormKind.RMSNORM), "norm.bias: RMSNorm has no bias")


@dataclass(frozen=True, kw_only=True, slots=True)
class MlaSpec:
    """DeepSeek multi-head latent attention (MLA) ranks and head sizes.

    Queries go through a low-rank ``q_lora_rank`` bottleneck (or a full
    projection when ``None``); keys and values are compressed into one
    ``kv_lora_rank`` latent plus a shared ``qk_rope_head_dim`` rotary key, which
    is what the KV cache stores. Source: DeepSeek-V2 report (arXiv 2405.04434) §2.1.
    """

    q_lora_rank: int | None
    """Rank of the query compression, or None for a direct h -> heads*(nope+rope) projection."""
    kv_lora_rank: int
    """Rank of the joint key/value latent (512 in DeepSeek-V2/V3)."""
    qk_nope_head_dim: int
    """Per-head query/key size without rotary embedding (128)."""
    qk_rope_head_dim: int
    """Per-head query/key size with rotary embedding; the key part is shared across heads (64)."""
    v_head_dim: int
    """Per-head value size (128)."""

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            _require(getattr(self, name) > 0, f"mla.{name}: must be a positive integer")
        _require(self.q_lora_rank is None or self.q_lora_rank > 0, "mla.q_lora_rank: must be positive or null")

    @property
    def qk_head_dim(self) -> int:
        """Query/key size per head: nope + rope parts."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True, kw_only=True, slots=True)
class AttentionSpec:
    """Self-attention shape of every layer (the window varies per layer, see LayerSpec)."""

    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads: = num_heads (MHA), 1 (MQA), a divisor in between (GQA)."""
    head_dim: int
    """Size of one query/key/value head (explicit in Qwen3, Gemma, Mistral-Nemo configs)."""
    qkv_bias: bool = False
    """Biases on the q, k and v projections (Qwen2, GPT-2, NeoX, StarCoder2, Phi-2)."""
    out_bias: bool = False
    """Bias on the output projection."""
    qk_norm: QKNorm = QKNorm.NONE
    """Query/key normalisation, if any."""
    qk_norm_spec: NormSpec = field(default_factory=NormSpec)
    """Kind of the q/k norms (LayerNorm with bias for Phi-2, RMSNorm elsewhere)."""
    mla: MlaSpec | None = None
    """Set for multi-head latent attention; then ``head_dim`` is the v head size."""
    logit_softcap: float | None = None
    """Gemma 2's attention logit soft-capping (forces eager attention in some stacks)."""
    dropout: float = 0.0
    """Attention-probability dropout during training."""
    sinks: bool = False
    """A learned sink logit per head joins every softmax (gpt-oss): ``num_heads`` more parameters."""
    output_gate: bool = False
    """The query projection also yields a per-head gate, ``o_proj(attn * sigmoid(gate))``
    (Qwen3-Next): ``q_proj`` is ``h -> 2 x heads x head_dim``."""
    clip_qkv: bool = False
    """Queries, keys and values are clamped in place (OLMoE ``clip_qkv``): autograd keeps a copy of each."""

    def __post_init__(self) -> None:
        _require(self.num_heads > 0, "attention.num_heads: must be a positive integer")
        _require(self.num_kv_heads > 0, "attention.num_kv_heads: must be a positive integer")
        _require(self.head_dim > 0, "attention.head_dim: must be a positive integer")
        _require(
            self.num_heads % self.num_kv_heads == 0,
            f"attention.num_kv_heads: {self.num_kv_heads} does not divide num_heads {self.num_heads}",
        )
        _require(0.0 <= self.dropout < 1.0, "attention.dropout: must be in [0, 1)")

    @property
    def kind(self) -> str:
        """ "MHA", "GQA", "MQA" or "MLA"."""
        if self.mla is not None:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"


@dataclass(frozen=True, kw_only=True, slots=True)
class MlpSpec:
    """A dense feed-forward block."""

    kind: MlpKind
    """Gated (3 matrices) or plain (2 matrices)."""
    intermediate_size: int
    """Inner width ``i``."""
    bias: bool = False
    """Biases on every projection."""
    activation: str = "silu"
    """Activation function name as in the config (silu, gelu_pytorch_tanh, gelu_new, ...)."""

    def __post_init__(self) -> None:
        _require(self.intermediate_size > 0, "mlp.intermediate_size: must be a positive integer")


@dataclass(frozen=True, kw_only=True, slots=True)
class MoeSpec:
    """A mixture-of-experts feed-forward block.

    All ``num_experts`` routed experts are resident in memory; each token uses
    ``experts_per_token`` of them plus every shared expert.
    """

    num_experts: int
    """Routed experts per MoE layer."""
    experts_per_token: int
    """Top-k experts each token is routed to."""
    expert_intermediate_size: int
    """Inner width of one routed expert."""
    expert_kind: MlpKind = MlpKind.GATED
    """Shape of one expert."""
    shared_intermediate_size: int = 0
    """Total inner width of the always-on shared expert(s); 0 when there are none."""
    num_shared_experts: int = 0
    """Number of shared experts folded into ``shared_intermediate_size`` (informational)."""
    shared_expert_gate: bool = False
    """A sigmoid gate Linear(h, 1) scaling the shared expert (Qwen2-MoE)."""
    shared_kind: MlpKind = MlpKind.GATED
    """Shape of the shared expert (Nemotron-H's is a plain up/down MLP)."""
    shared_bias: bool = False
    """Biases on the shared expert's projections (Nemotron-H with ``mlp_bias``)."""
    router_score_bias: bool = False
    """A per-expert score-correction bias kept as a buffer, not a parameter (DeepSeek-V3)."""
    router_bias: bool = False
    """The router is a biased ``h -> E`` linear (gpt-oss): ``E`` more parameters per MoE layer."""
    expert_bias: bool = False
    """Every routed expert's projections have biases (gpt-oss: ``2i`` on gate/up, ``h`` on down)."""
    activation: str = "silu"
    """Experts' activation function."""

    def __post_init__(self) -> None:
        _require(self.num_experts > 0, "moe.num_experts: must be a positive integer")
        _require(self.expert_intermediate_size > 0, "moe.expert_intermediate_size: must be a positive integer")
        _require(
            0 < self.experts_per_token <= self.num_experts,
            f"moe.experts_per_token: must be between 1 and num_experts ({self.num_experts}), got {self.experts_per_token}",
        )
        _require(self.shared_intermediate_size >= 0, "moe.shared_intermediate_size: must not be negative")


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerKind:
    """What decides a decoder layer's parameters and activations: its token mixer, its feed-forward
    block, and (for the estimator, which knows the sequence) whether its attention is masked by a
    window or chunk and whether it applies rotary embeddings.

    Estimator terms are registries keyed by the mixer and the FFN kind; a kind without an entry
    is refused in one line, never counted as another kind."""

    mixer: MixerKind = MixerKind.ATTENTION
    ffn: FfnKind = FfnKind.DENSE
    sliding: bool = False
    """The attention is masked: a sliding window shorter than the sequence, or an attention chunk
    the keys reach (Llama 4); attention layers only."""
    rope: bool = True
    """The attention applies rotary embeddings (False for a NoPE layer: Llama 4's global layers)."""

    @property
    def attends(self) -> bool:
        """The mixer includes softmax attention."""
        return self.mixer in ATTENDING_MIXERS

    @property
    def structure(self) -> LayerKind:
        """The kind without the estimator's per-sequence flags: what decides the layer's modules and parameters."""
        return LayerKind(mixer=self.mixer, ffn=self.ffn)

    @property
    def label(self) -> str:
        """A short name for messages: ``attention+moe``, ``mamba+dense``, ``attention+moe (sliding, NoPE)``."""
        flags = [name for name, on in (("sliding", self.sliding), ("NoPE", not self.rope)) if on]
        return f"{self.mixer.value}+{self.ffn.value}" + (f" ({', '.join(flags)})" if flags else "")


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerSpec:
    """What varies from one decoder layer to the next."""

    window: int | None = None
    """Sliding-window size for local attention layers; None for full (global) attention."""
    ffn: FfnKind = FfnKind.DENSE
    """The layer's feed-forward block: the dense MLP, the MoE block, or none."""
    mixer: MixerKind = MixerKind.ATTENTION
    """The layer's token mixer."""
    chunk: int | None = None
    """Chunked local attention (Llama 4): queries see only keys of their own chunk of this many tokens."""
    rope: bool = True
    """Rotary embeddings are applied in this layer's attention (False: a NoPE layer)."""

    def __post_init__(self) -> None:
        _require(self.window is None or self.window > 0, "layer.window: must be a positive integer or null")
        _require(self.chunk is None or self.chunk > 0, "layer.chunk: must be a positive integer or null")
        _require(
            self.mixer in ATTENDING_MIXERS or (self.window is None and self.chunk is None),
            "layer.window: only attention layers have a window or chunk",
        )

    @property
    def moe(self) -> bool:
        """True when this layer's FFN is the MoE block."""
        return self.ffn is FfnKind.MOE

    @property
    def attends(self) -> bool:
        """The layer's mixer includes softmax attention (a KV cache per token)."""
        return self.mixer in ATTENDING_MIXERS

    @property
    def kind(self) -> LayerKind:
        """The layer's mixer and FFN kind (the window is left to the estimator, which knows the sequence)."""
        return LayerKind(mixer=self.mixer, ffn=self.ffn)

    def kind_at(self, seq: int) -> LayerKind:
        """The layer's full kind at sequence length ``seq``: mixer, FFN, masked attention, rotary.

        A window at least as long as the sequence is plain causal attention: transformers then
        passes no mask to SDPA (``_ignore_causal_mask_sdpa``); an attention chunk masks once the
        keys reach its size (``kv_length >= local_attention_size``)."""
        masked = (self.window is not None and self.window < seq) or (self.chunk is not None and self.chunk <= seq)
        return LayerKind(mixer=self.mixer, ffn=self.ffn, sliding=masked, rope=self.rope)


@dataclass(frozen=True, kw_only=True, slots=True)
class PositionSpec:
    """Position encoding and context limit."""

    kind: PositionKind
    """Rotary, learned, ALiBi or none."""
    max_positions: int
    """``max_position_embeddings``: the context the checkpoint declares."""
    rope_theta: float | None = None
    """Rotary base frequency."""
    rotary_fraction: float = 1.0
    """Fraction of each head that is rotated (partial rotary: Phi-2 0.4, NeoX rotary_pct)."""
    rope_scaling: str | None = None
    """Rotary scaling type (llama3, yarn, linear, dynamic, longrope), if any."""
    rope_scaling_factor: float | None = None
    """Rotary scaling factor, if any."""

    def __post_init__(self) -> None:
        _require(self.max_positions > 0, "position.max_positions: must be a positive integer")
        _require(0.0 < self.rotary_fraction <= 1.0, "position.rotary_fraction: must be in (0, 1]")
