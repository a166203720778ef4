"""What the generic reader learns from a model's module tree (pure data, no torch).

:mod:`vramlens.model.generic.reader` builds a model with transformers on the meta device
and records, per distinct kind of decoder layer, its parameters by component and its
linear modules; outside the layers, the embedding, head, final norm, vision tower,
projector and anything else. These records are what the estimator needs to place weights,
gradients, optimizer state, LoRA adapters and quantized formats, and they are stored as
JSON in the recipe cache (:mod:`vramlens.model.generic.store`) so that a second use needs
no torch.

Elements are counted as ``model.parameters()`` counts them: tied tensors once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vramlens._compat import StrEnum
from vramlens.errors import ConfigError
from vramlens.model.modules import LinearShape

__all__ = ["Component", "ExpertTensor", "GenericLayout", "LayerKindLayout", "layout_from_json", "layout_to_json"]


class Component(StrEnum):
    """Kinds of parameters, as ``vramlens models show`` lists them."""

    EMBEDDING = "embedding"
    POSITION_EMBEDDING = "position_embedding"
    ATTENTION = "attention"
    LINEAR_ATTENTION = "linear_attention"
    SSM = "ssm"
    """State-space (Mamba) mixers, their convolutions included."""
    MLP = "mlp"
    MOE_EXPERTS = "moe_experts"
    MOE_SHARED = "moe_shared"
    MOE_ROUTER = "moe_router"
    NORMS = "norms"
    FINAL_NORM = "final_norm"
    LM_HEAD = "lm_head"
    VISION = "vision"
    PROJECTOR = "projector"
    MTP = "mtp"
    """Multi-token-prediction layers built beside the decoder stack."""
    OTHER = "other"
    """Parameters the reader could not name; counted, shown, never dropped."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpertTensor:
    """A 3-D routed-expert parameter (``[experts, out, in]`` or ``[experts, in, out]``)."""

    name: str
    experts: int
    elements: int
    """Elements of all experts together."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerKindLayout:
    """One distinct kind of decoder layer (same module classes and parameter shapes)."""

    name: str
    """The layer class and what tells it apart (``Qwen3NextDecoderLayer[linear_attn]``)."""
    components: tuple[tuple[Component, int], ...]
    """Parameter elements of one layer of this kind, by component."""
    linears: tuple[LinearShape, ...]
    """Every ``nn.Linear`` of the layer, named by its path inside the layer."""
    experts: tuple[ExpertTensor, ...] = ()
    """Fused routed-expert parameters (not ``nn.Linear``: neither LoRA targets nor bitsandbytes-quantized)."""
    largest_tensor: int = 0
    """Elements of the layer's largest single parameter."""

    @property
    def elements(self) -> int:
        """Every parameter element of one layer."""
        return sum(count for _, count in self.components)

    def component(self, kind: Component) -> int:
        """Elements of one component in one layer."""
        return sum(count for name, count in self.components if name is kind)


@dataclass(frozen=True, kw_only=True, slots=True)
class GenericLayout:
    """The parameters of a model read from its module tree, by layer kind and component."""

    model_class: str
    """The transformers class that was built (``Qwen3NextForCausalLM``)."""
    auto_class: str
    """The auto class that built it (``AutoModelForCausalLM`` or ``AutoModelForImageTextToText``)."""
    layers_path: str
    """Where the decoder layers live in the module tree (``model.layers``)."""
    kinds: tuple[LayerKindLayout, ...]
    layer_kinds: tuple[int, ...]
    """For each decoder layer, the index of its kind."""
    outside: tuple[tuple[Component, int], ...]
    """Parameters outside the decoder layers, by component (tied tensors once)."""
    hidden_size: int
    """Width of the residual stream (the token embedding's row size)."""
    vocab_size: int
    """Rows of the token embedding."""
    tied_embeddings: bool
    """The LM head shares the input embedding's tensor."""
    head_elements: int
    """Elements of the LM head's own weight (and bias); 0 when tied."""
    experts_per_token: int | None = None
    """Routed experts each token visits (from the config), when the model has routed experts."""
    num_experts: int | None = None
    """Routed experts per MoE layer, when the model has them."""
    dtype: str = "float32"
    """The dtype the config declares (what ``from_pretrained`` loads)."""
    sdpa: bool = True
    """The class accepts ``attn_implementation="sdpa"`` (its ``_supports_sdpa``)."""

    def __post_init__(self) -> None:
        if not self.kinds or any(not 0 <= k < len(self.kinds) for k in self.layer_kinds):
            raise ConfigError("generic layout: every decoder layer must name one of its layer kinds")

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    def kind_counts(self, layer_range: range | None = None) -> dict[int, int]:
        """How many layers of each kind ``layer_range`` holds (all layers by default)."""
        indices = range(self.num_layers) if layer_range is None else layer_range
        counts: dict[int, int] = {}
        for index in indices:
            kind = self.layer_kinds[index]
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def totals(self) -> dict[Component, int]:
        """Elements of the whole model by component."""
        totals: dict[Component, int] = {}
        for component, count in self.outside:
            totals[component] = totals.get(component, 0) + count
        for kind, layers in self.kind_counts().items():
            for component, count in self.kinds[kind].components:
                totals[component] = totals.get(component, 0) + count * layers
        return totals

    @property
    def total(self) -> int:
        return sum(self.totals().values())

    @property
    def active(self) -> int:
        """Elements a token passes through: all but the routed experts it does not visit."""
        routed = self.totals().get(Component.MOE_EXPERTS, 0)
        if not routed or not self.num_experts or not self.experts_per_token:
            return self.total
        return self.total - routed + routed * self.experts_per_token // self.num_experts


def _shape_to_json(shape: LinearShape) -> list[Any]:
    return [shape.name, shape.in_features, shape.out_features, shape.group, shape.bias]


def _kind_to_json(kind: LayerKindLayout) -> dict[str, Any]:
    return {
        "name": kind.name,
        "components": [[c.value, n] for c, n in kind.components],
        "linears": [_shape_to_json(s) for s in kind.linears],
        "experts": [[e.name, e.experts, e.elements] for e in kind.experts],
        "largest_tensor": kind.largest_tensor,
    }


def layout_to_json(layout: GenericLayout) -> dict[str, Any]:
    """A JSON-safe dict of ``layout`` (ints and strings only)."""
    return {
        "model_class": layout.model_class,
        "auto_class": layout.auto_class,
        "layers_path": layout.layers_path,
        "kinds": [_kind_to_json(kind) for kind in layout.kinds],
        "layer_kinds": list(layout.layer_kinds),
        "outside": [[c.value, n] for c, n in layout.outside],
        "hidden_size": layout.hidden_size,
        "vocab_size": layout.vocab_size,
        "tied_embeddings": layout.tied_embeddings,
        "head_elements": layout.head_elements,
        "experts_per_token": layout.experts_per_token,
        "num_experts": layout.num_experts,
        "dtype": layout.dtype,
        "sdpa": layout.sdpa,
    }


def _components(raw: Any) -> tuple[tuple[Component, int], ...]:
    return tuple((Component(name), int(count)) for name, count in raw)


def layout_from_json(data: Mapping[str, Any]) -> GenericLayout:
    """The inverse of :func:`layout_to_json` (raises ``KeyError``/``ValueError``/``TypeError`` on a bad file)."""
    kinds = tuple(
        LayerKindLayout(
            name=str(kind["name"]),
            components=_components(kind["components"]),
            linears=tuple(
                LinearShape(name=str(n), in_features=int(i), out_features=int(o), group=str(g), bias=bool(b))
                for n, i, o, g, b in kind["linears"]
            ),
            experts=tuple(ExpertTensor(name=str(n), experts=int(e), elements=int(c)) for n, e, c in kind["experts"]),
            largest_tensor=int(kind["largest_tensor"]),
        )
        for kind in data["kinds"]
    )
    experts_per_token = data["experts_per_token"]
    num_experts = data["num_experts"]
    return GenericLayout(
        model_class=str(data["model_class"]),
        auto_class=str(data["auto_class"]),
        layers_path=str(data["layers_path"]),
        kinds=kinds,
        layer_kinds=tuple(int(k) for k in data["layer_kinds"]),
        outside=_components(data["outside"]),
        hidden_size=int(data["hidden_size"]),
        vocab_size=int(data["vocab_size"]),
        tied_embeddings=bool(data["tied_embeddings"]),
        head_elements=int(data["head_elements"]),
        experts_per_token=None if experts_per_token is None else int(experts_per_token),
        num_experts=None if num_experts is None else int(num_experts),
        dtype=str(data["dtype"]),
        sdpa=bool(data["sdpa"]),
    )
