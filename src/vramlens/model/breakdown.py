"""The parameter counts of a model by component (:class:`ParameterBreakdown`), and the breakdown of a
model read from its code (:func:`generic_breakdown`); the counting rules of native families are in
:mod:`vramlens.model.params`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vramlens.model.generic.layout import GenericLayout

__all__ = ["ParameterBreakdown", "generic_breakdown"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ParameterBreakdown:
    """Parameter counts (elements) of a model by component; ``total`` is their sum.

    Tied embeddings are counted once, under ``embedding`` (``lm_head`` is then 0,
    or only its bias). ``persistent_buffers`` is *not* part of ``total``.
    """

    embedding: int
    """Token embedding ``V*h``."""
    position_embedding: int
    """Learned absolute positions ``P*h`` (GPT-2); 0 for rotary/ALiBi."""
    attention: int
    """All layers' attention projections and q/k norms."""
    mlp: int
    """All dense layers' MLPs."""
    moe_experts: int
    """All MoE layers' routed experts."""
    moe_shared: int
    """All MoE layers' shared experts and shared-expert gates."""
    moe_router: int
    """All MoE layers' routers."""
    norms: int
    """All layers' hidden-size norms."""
    final_norm: int
    """The norm after the last layer."""
    lm_head: int
    """The output projection (0 when tied, except a bias)."""
    extra: int = 0
    """Other named parts outside the decoder stack of native families (``ModelSpec.extra_parameters``)."""
    linear_attention: int = 0
    """All layers' linear-attention mixers (gated DeltaNet), their convolutions included."""
    ssm: int = 0
    """All layers' state-space (Mamba) mixers: projections, convolutions, A, D, dt and gated norms."""
    vision: int = 0
    """A multimodal model's vision tower (its image encoder): a native family's
    (``ModelSpec.vision``) or one read from the model's code."""
    projector: int = 0
    """The multimodal projector between a vision tower and the decoder."""
    mtp: int = 0
    """Multi-token-prediction layers built beside the decoder stack."""
    other: int = 0
    """Parameters of a model read from its code that no component names (shown, never dropped)."""
    persistent_buffers: int = 0
    """Elements of saved buffers that are not parameters (router score-correction biases)."""

    @property
    def total(self) -> int:
        """Sum of every parameter component (buffers excluded)."""
        return (
            self.embedding
            + self.position_embedding
            + self.attention
            + self.mlp
            + self.moe_experts
            + self.moe_shared
            + self.moe_router
            + self.norms
            + self.final_norm
            + self.lm_head
            + self.linear_attention
            + self.ssm
            + self.outside_decoder
        )

    @property
    def layers(self) -> int:
        """Every decoder layer's parameters: mixers, FFNs and the layers' norms."""
        return (
            self.attention
            + self.ssm
            + self.linear_attention
            + self.mlp
            + self.moe_experts
            + self.moe_shared
            + self.moe_router
            + self.norms
        )

    @property
    def outside_decoder(self) -> int:
        """Parameters outside the decoder stack (embedding and head aside): vision tower, projector,
        multi-token-prediction layers, extra and unnamed parts."""
        return self.extra + self.vision + self.projector + self.mtp + self.other

    @property
    def non_embedding(self) -> int:
        """Total minus token/position embeddings and the LM head (the "non-embedding" count model cards quote)."""
        return self.total - self.embedding - self.position_embedding - self.lm_head

    def as_dict(self) -> dict[str, int]:
        """Components and ``total`` as a JSON-safe dict of ints."""
        return {**asdict(self), "total": self.total}


def generic_breakdown(layout: GenericLayout) -> ParameterBreakdown:
    """The components a model's module tree was read into (:mod:`vramlens.model.generic`)."""
    totals = {component.value: count for component, count in layout.totals().items()}
    return ParameterBreakdown(
        embedding=totals.get("embedding", 0),
        position_embedding=totals.get("position_embedding", 0),
        attention=totals.get("attention", 0),
        mlp=totals.get("mlp", 0),
        moe_experts=totals.get("moe_experts", 0),
        moe_shared=totals.get("moe_shared", 0),
        moe_router=totals.get("moe_router", 0),
        norms=totals.get("norms", 0),
        final_norm=totals.get("final_norm", 0),
        lm_head=totals.get("lm_head", 0),
        linear_attention=totals.get("linear_attention", 0),
        ssm=totals.get("ssm", 0),
        vision=totals.get("vision", 0),
        projector=totals.get("projector", 0),
        mtp=totals.get("mtp", 0),
        other=totals.get("other", 0),
    )
