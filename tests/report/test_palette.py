"""Every category has a distinct color and fill (report/palette.py)."""

from __future__ import annotations

import re

from vramlens.categories import Category
from vramlens.report.palette import PALETTE, swatch


def test_every_category_is_drawn_distinctly() -> None:
    assert set(PALETTE) == set(Category)
    assert len({s.hex for s in PALETTE.values()}) == len(Category)
    assert len({s.ascii for s in PALETTE.values()}) == len(Category)
    assert all(re.fullmatch(r"#[0-9a-f]{6}", s.hex) for s in PALETTE.values())
    assert all(len(s.ascii) == 1 and s.ascii.isascii() and s.ascii.isprintable() for s in PALETTE.values())


def test_the_seed_colors_of_memory_viz_bands() -> None:
    """Seed 002: parameters blue, optimizer state green, activations orange, gradients yellow,
    optimizer intermediates red (the dominant RGB channel of each hex)."""

    def rgb(category: Category) -> tuple[int, int, int]:
        value = swatch(category).hex
        return int(value[1:3], 16), int(value[3:5], 16), int(value[5:7], 16)

    r, g, b = rgb(Category.PARAMETERS)
    assert b > r and b > g
    r, g, b = rgb(Category.OPTIMIZER_STATE)
    assert g > r and g > b
    r, g, b = rgb(Category.TEMPORARY)
    assert r > g and r > b
    r, g, b = rgb(Category.GRADIENTS)
    assert r > b and g > b and abs(r - g) < 60  # yellow: red and green high, blue low
    r, g, b = rgb(Category.ACTIVATIONS)
    assert r > g > b  # orange
