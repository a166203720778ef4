"""One color and one fill character per memory category, shared by every picture.

The colors follow the bands users already know from PyTorch's memory_viz as colored by hand
in seed ``002_*`` (parameters blue, optimizer state green, activations orange, gradients
yellow, optimizer intermediates red), with the remaining categories in muted tones. Hex
colors are for matplotlib and HTML; the rich style names for the terminal; ``ascii`` fills
for terminals without UTF-8 (``--ascii``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.categories import Category

__all__ = ["PALETTE", "Swatch", "swatch"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Swatch:
    """How one category is drawn."""

    hex: str
    """``#rrggbb`` for plots and HTML."""
    rich: str
    """A rich color for the terminal (the nearest of the 256-color table)."""
    ascii: str
    """One printable ASCII character that fills the category's band."""
    label: str
    """The legend's name."""


PALETTE: dict[Category, Swatch] = {
    Category.PARAMETERS: Swatch(hex="#3b6fd4", rich="royal_blue1", ascii="P", label="parameters"),
    Category.GRADIENTS: Swatch(hex="#e8c21a", rich="gold1", ascii="G", label="gradients"),
    Category.OPTIMIZER_STATE: Swatch(hex="#2e9e4f", rich="green3", ascii="O", label="optimizer state"),
    Category.ACTIVATIONS: Swatch(hex="#f08a24", rich="dark_orange", ascii="A", label="activations"),
    Category.KV_CACHE: Swatch(hex="#8e5bd0", rich="medium_purple", ascii="K", label="KV cache"),
    Category.TEMPORARY: Swatch(hex="#d9412b", rich="red3", ascii="T", label="temporary"),
    Category.INPUTS: Swatch(hex="#3fb5c4", rich="dark_cyan", ascii="I", label="inputs"),
    Category.BUFFERS: Swatch(hex="#8c6d52", rich="tan", ascii="B", label="buffers"),
    Category.OTHER: Swatch(hex="#9a9a9a", rich="grey62", ascii="o", label="other"),
    Category.ALLOCATOR_SLACK: Swatch(hex="#c9c9c9", rich="grey78", ascii=".", label="allocator slack"),
    Category.RUNTIME: Swatch(hex="#5a5a5a", rich="grey42", ascii="R", label="runtime"),
}


def swatch(category: Category) -> Swatch:
    """The swatch of ``category``."""
    return PALETTE[Category(category)]
