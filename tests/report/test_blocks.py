"""The plain-text layout of a report (:mod:`vramlens.report.blocks`) is what rich prints without
colors, character for character, wherever it answers; where it cannot (a table wider than the
line), it says so and rich prints."""

from __future__ import annotations

import io
import random

import pytest
from rich.console import Console, Group
from rich.text import Text

from vramlens.estimator import estimate
from vramlens.report.blocks import Column, Line, TableBlock, plain_lines, to_rich, wrap
from vramlens.report.text import report_blocks

WORKLOADS = (
    {"model": "llama-3.1-8b"},
    {"model": "llama-3.1-8b", "gpu": "rtx-4090", "method": "lora"},
    {"model": "llama-3-70b", "method": "lora", "parallel": {"gpus": 8, "shard": "zero3"}, "gpu": "a100-80gb"},
    {"model": "qwen2.5-7b", "method": "qlora", "gpu": "rtx-4090", "parallel": {"pp": 2, "gpus": 2}},
    {"model": "llama-3.1-8b", "mode": "infer", "engine": "vllm", "gpu": "h100-80gb"},
    {"model": "llama-3.1-8b", "mode": "infer", "gpu": "l4"},
)


def rich_lines(blocks: list, width: int) -> list[str]:
    """What rich prints for ``blocks`` on a colorless console ``width`` columns wide."""
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, highlight=False, markup=False, emoji=False)
    console.print(Group(*(to_rich(block) for block in blocks)))
    return out.getvalue().split("\n")[:-1]


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: "-".join(str(v) for v in w.values())[:40])
def test_a_report_laid_out_plainly_is_what_rich_prints(workload: dict) -> None:
    report = estimate(workload)
    answered = 0
    for explain in (False, True):
        for ascii_only in (False, True):
            blocks = report_blocks(report, explain=explain, ascii_only=ascii_only)
            for width in (40, 72, 100, 120, 160, 240):
                plain = plain_lines(blocks, width)
                if plain is not None:
                    answered += 1
                    assert plain == rich_lines(blocks, width), (explain, ascii_only, width)
    assert answered >= 4  # the plain layout answers at the piped width and wider


def test_the_default_piped_estimate_is_laid_out_without_rich() -> None:
    blocks = report_blocks(estimate({"model": "llama-3.1-8b"}))
    assert plain_lines(blocks, 120) is not None


def test_a_table_wider_than_the_line_is_left_to_rich() -> None:
    table = TableBlock(columns=(Column(header="a"), Column(header="b")), rows=[("x" * 50, "y" * 50)])
    assert plain_lines([table], 80) is None
    assert plain_lines([table], 120) == rich_lines([table], 120)


def test_text_that_is_not_plain_ascii_is_left_to_rich() -> None:
    assert plain_lines([Line(text="模型 name")], 80) is None
    assert plain_lines([Line(text="tab\there")], 80) is None


def test_wrapping_is_richs_word_wrap() -> None:
    rng = random.Random(7)
    console = Console(file=io.StringIO(), color_system=None)
    for _ in range(2000):
        words = [rng.choice("abcdefghij") * rng.randint(1, 30) for _ in range(rng.randint(0, 12))]
        text = "".join(word + " " * rng.choice((1, 1, 1, 2, 0)) for word in words)
        text = " " * rng.choice((0, 0, 2)) + text
        width = rng.randint(1, 60)
        for pad in (False, True):
            lines = Text(text).wrap(console, width, justify="left" if pad else "default")
            assert wrap(text, width, pad=pad) == [line.plain for line in lines], (text, width, pad)
