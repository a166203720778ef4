"""``ModelSpec``: everything GPU memory depends on, for one transformer checkpoint.

A spec is built from a config (``model/families/``), a catalog entry or a
checkpoint, and is immutable. It describes shapes, not weights: parameter
counts and byte sizes are derived from it by the pure functions in
``model/params.py`` and exposed here as properties. Its parts (attention, MLP,
MoE, norms, positions, per-layer layout) are in ``model/components.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from vramlens.model.components import (
    MAMBA_MIXERS,
    AttentionSpec,
    FfnKind,
    LayerKind,
    LayerSpec,
    MixerKind,
    MlaSpec,
    MlpKind,
    MlpSpec,
    MoeSpec,
    NormKind,
    NormSpec,
    PositionKind,
    PositionSpec,
    QKNorm,
    TowerLinear,
    VisionSpec,
    _require,
)
from vramlens.model.ssm import LinearAttentionSpec, MambaSpec

if TYPE_CHECKING:
    from vramlens.model.generic.layout import GenericLayout
    from vramlens.model.params import ParameterBreakdown
    from vramlens.model.quantization import QuantizationSpec
    from vramlens.model.safetensors import CheckpointSummary

__all__ = [
    "AttentionSpec",
    "FfnKind",
    "LayerKind",
    "LayerSpec",
    "LinearAttentionSpec",
    "MambaSpec",
    "MixerKind",
    "MlaSpec",
    "MlpKind",
    "MlpSpec",
    "ModelSpec",
    "MoeSpec",
    "NormKind",
    "NormSpec",
    "PositionKind",
    "PositionSpec",
    "QKNorm",
    "TowerLinear",
    "VisionSpec",
]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Everything GPU memory depends on, for one checkpoint. Immutable.

    Build one with :func:`vramlens.load_model` (catalog name, path, HF id) or
    :func:`vramlens.model_from_config` (a config dict). Derived quantities
    (parameter counts per component, active parameters, bytes) are properties.
    """

    name: str
    """Display name (catalog alias, HF id or path)."""
    model_type: str
    """The config's ``model_type`` (llama, qwen3_moe, ...)."""
    hidden_size: int
    """Residual stream width ``h``."""
    num_layers: int
    """Decoder layers ``L``."""
    vocab_size: int
    """Rows of the embedding (and of the LM head)."""
    attention: AttentionSpec | None
    """Self-attention shape (None for a model described from its code: see ``generic``)."""
    mlp: MlpSpec | None
    """The dense FFN used by non-MoE layers (None when every layer is MoE)."""
    moe: MoeSpec | None = None
    """The MoE FFN used by MoE layers (None for dense models)."""
    mamba: MambaSpec | None = None
    """The Mamba mixer of Mamba layers (and of Falcon-H1's attention+Mamba layers)."""
    linear_attention: LinearAttentionSpec | None = None
    """The linear-attention mixer of linear-attention layers (Qwen3-Next's gated DeltaNet)."""
    layers: tuple[LayerSpec, ...]
    """One entry per decoder layer."""
    norm: NormSpec = field(default_factory=NormSpec)
    """Kind of every hidden-size norm."""
    norms_per_layer: int = 2
    """Hidden-size norms in one decoder layer (2 pre-norm, 4 for Gemma 2/3 sandwich norms, 1 parallel)."""
    final_norm: bool = True
    """A norm after the last layer."""
    position: PositionSpec
    """Positions and context limit."""
    tie_word_embeddings: bool = False
    """LM head shares the embedding matrix (then it adds no parameters)."""
    lm_head_bias: bool = False
    """The LM head has a bias (Phi-2)."""
    parallel_residual: bool = False
    """Attention and MLP read the same input in parallel (GPT-J/NeoX/Falcon/Phi-2 style)."""
    hidden_dropout: float = 0.0
    """Residual dropout probability during training (GPT-2: 0.1)."""
    embedding_dropout: float = 0.0
    """Embedding dropout probability during training."""
    final_logit_softcap: float | None = None
    """Gemma 2's final logit soft-capping."""
    dtype: str = "bfloat16"
    """Checkpoint dtype (``torch_dtype``/``dtype`` in the config), canonical name."""
    quantization: QuantizationSpec | None = None
    """The checkpoint's weight quantization, when its config declares one."""
    checkpoint: CheckpointSummary | None = field(default=None, repr=False, compare=False)
    """Exact tensor counts and bytes read from the safetensors headers, when the model came from files."""
    extra_parameters: tuple[tuple[str, int], ...] = ()
    """Named parameter counts of other parts outside the decoder stack."""
    vision: VisionSpec | None = None
    """The vision tower and projector of a multimodal model (None for text-only models)."""
    architecture: str | None = None
    """First entry of ``architectures`` in the config, if any."""
    hf_id: str | None = None
    """Hugging Face repository id, when known."""
    source: str = ""
    """Where the spec came from: ``catalog:NAME``, a file path, or ``dict``."""
    config: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    """The ``config.json`` the spec was parsed from (the simulator builds the real model from it)."""
    assumptions: tuple[str, ...] = ()
    """What the parser had to assume (defaults for absent keys, aliases, ...)."""
    generic: GenericLayout | None = field(default=None, compare=False)
    """Set when no native family describes the model: its parameters as read from transformers'
    module tree (:mod:`vramlens.model.generic`); its memory then comes from recipes traced from
    the real code, never from the attention/MLP formulas."""

    def __post_init__(self) -> None:
        _require(self.hidden_size > 0, "hidden_size: must be a positive integer")
        _require(self.num_layers > 0, "num_layers: must be a positive integer")
        _require(self.vocab_size > 0, "vocab_size: must be a positive integer")
        _require(
            len(self.layers) == self.num_layers,
            f"layers: {len(self.layers)} layer entries for num_layers={self.num_layers}",
        )
        if self.generic is None:
            uses_moe = any(layer.ffn is FfnKind.MOE for layer in self.layers)
            uses_dense = any(layer.ffn is FfnKind.DENSE for layer in self.layers)
            _require(self.attention is not None, "attention: a native family must describe its attention")
            _require(not uses_moe or self.moe is not None, "moe: MoE layers present but no MoE block described")
            _require(not uses_dense or self.mlp is not None, "mlp: dense layers present but no dense MLP described")
            _require(
                self.mamba is not None or not any(layer.mixer in MAMBA_MIXERS for layer in self.layers),
                "mamba: Mamba layers present but no Mamba mixer described",
            )
            _require(
                self.linear_attention is not None
                or not any(layer.mixer is MixerKind.LINEAR_ATTENTION for layer in self.layers),
                "linear_attention: linear-attention layers present but no linear-attention mixer described",
            )
        else:
            _require(len(self.generic.layer_kinds) == self.num_layers, "generic: one layer kind per decoder layer")
        _require(self.norms_per_layer >= 0, "norms_per_layer: must not be negative")
        for name, extra in self.extra_parameters:
            _require(extra >= 0, f"extra_parameters.{name}: must not be negative")

    # ---- shape shortcuts -------------------------------------------------
    @property
    def attn(self) -> AttentionSpec:
        """The attention shape of a native family (a model described from its code has none to read:
        its estimates come from recipes, and reaching here is a bug, not a guess)."""
        if self.attention is None:
            raise AssertionError(f"{self.name}: attention shape asked of a model described from its code")
        return self.attention

    @property
    def num_heads(self) -> int:
        """Query heads."""
        return self.attn.num_heads

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads."""
        return self.attn.num_kv_heads

    @property
    def head_dim(self) -> int:
        """Head size."""
        return self.attn.head_dim

    @property
    def max_position_embeddings(self) -> int:
        """Context length the checkpoint declares."""
        return self.position.max_positions

    @property
    def is_moe(self) -> bool:
        """True when any layer is a mixture of experts."""
        return any(layer.moe for layer in self.layers)

    @property
    def sliding_window(self) -> int | None:
        """The largest sliding window among local-attention layers, or None if all are global."""
        windows = [layer.window for layer in self.layers if layer.window is not None]
        return max(windows) if windows else None

    @property
    def num_moe_layers(self) -> int:
        """Layers whose FFN is the MoE block."""
        return sum(1 for layer in self.layers if layer.moe)

    @cached_property
    def derived_cache(self) -> dict[object, object]:
        """Per-spec memo of derived shapes (used by estimators; not part of the spec's value)."""
        return {}

    # ---- parameters ------------------------------------------------------
    @cached_property
    def parameter_breakdown(self) -> ParameterBreakdown:
        """Parameter counts per component (see :class:`vramlens.model.params.ParameterBreakdown`)."""
        from vramlens.model.params import parameter_breakdown

        return parameter_breakdown(self)

    @property
    def num_parameters(self) -> int:
        """Total parameters, counting a tied embedding/head once (as ``model.parameters()`` does)."""
        return self.parameter_breakdown.total

    @cached_property
    def active_parameters(self) -> int:
        """Parameters used per token: total minus the routed experts a token does not visit (MoE)."""
        from vramlens.model.params import active_parameters

        return active_parameters(self)
