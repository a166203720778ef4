"""The image side of a multimodal model: :class:`VisionSpec` (vision tower and projector) and the
:class:`TowerLinear` modules LoRA can target in them; re-exported by :mod:`vramlens.model.components`.

Frozen, keyword-only dataclasses validated in ``__post_init__``; a bad value raises
:class:`~vramlens.errors.ConfigError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.errors import ConfigError

__all__ = ["PROJECTOR", "VISION_TOWER", "TowerLinear", "VisionSpec"]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


#: The two parts of a multimodal model outside its text decoder.
VISION_TOWER = "vision_tower"
PROJECTOR = "projector"


@dataclass(frozen=True, kw_only=True, slots=True)
class TowerLinear:
    """``count`` identical ``nn.Linear`` modules of a vision tower or projector.

    ``name`` is the end of the module path as PEFT matches ``target_modules`` against it
    (``attn.qkv``, ``mlp.gate_proj``, ``multi_modal_projector.linear_1``).
    """

    name: str
    in_features: int
    out_features: int
    bias: bool
    count: int = 1
    part: str = VISION_TOWER
    """``vision_tower`` or ``projector``."""

    def __post_init__(self) -> None:
        _require(self.in_features > 0 and self.out_features > 0, f"vision.{self.name}: features must be positive")
        _require(self.count > 0, f"vision.{self.name}: count must be positive")
        _require(self.part in (VISION_TOWER, PROJECTOR), f"vision.{self.name}: part must be vision_tower or projector")

    @property
    def parameters(self) -> int:
        """Elements of all ``count`` modules: ``count x (in x out (+ out))``."""
        return self.count * (self.in_features * self.out_features + (self.out_features if self.bias else 0))


@dataclass(frozen=True, kw_only=True, slots=True)
class VisionSpec:
    """The image side of a multimodal model: the vision tower and the projector that maps its
    features to the text model's width (module paths per family in ``model/families/towers.py``).

    vramlens models text-only batches: the tower and projector hold their weights (and, under
    LoRA, the adapters PEFT puts on their linears) but compute nothing and receive no gradient.
    """

    kind: str
    """The tower's transformers implementation (pixtral, siglip, qwen2_5_vl, qwen3_vl, llama4)."""
    tower_parameters: int
    """Every parameter of the vision tower."""
    projector_parameters: int
    """Every parameter of the projector."""
    linears: tuple[TowerLinear, ...]
    """The ``nn.Linear`` modules of both parts (LoRA targets, quantized weights)."""
    hidden_size: int
    """The tower's width."""
    num_layers: int
    """The tower's encoder layers."""

    def __post_init__(self) -> None:
        _require(self.tower_parameters > 0, "vision: the tower must have parameters")
        _require(self.projector_parameters >= 0, "vision: projector parameters must not be negative")
        for part, total in ((VISION_TOWER, self.tower_parameters), (PROJECTOR, self.projector_parameters)):
            linear = sum(s.parameters for s in self.linears if s.part == part)
            _require(linear <= total, f"vision: {part} linears hold {linear} parameters of {total}")

    @property
    def parameters(self) -> int:
        """Tower and projector together."""
        return self.tower_parameters + self.projector_parameters
