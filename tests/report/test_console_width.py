"""Piped output uses one width, 120 columns, in every command (plan rows and the RLHF phase table
ran to 150-170 columns while the rich tables stopped at 120, and compare's table at rich's 80)."""

from __future__ import annotations

from typing import Any

import pytest

from vramlens.cli import main
from vramlens.report.console import PIPED_WIDTH, fit_lines


@pytest.mark.parametrize(
    "args",
    [
        ["estimate", "llama-3.1-8b", "--gpu", "h100"],
        ["estimate", "llama-3.1-8b", "--mode", "infer", "--engine", "vllm", "--gpu", "h100"],
        ["plan", "llama-3.1-8b", "--gpu", "h100", "--gpus", "2"],
        ["gpus"],
        ["gpus", "h100"],
        ["models", "list"],
        ["rlhf", "--algo", "ppo", "--actor", "llama-3.1-70b", "--gpu", "h100-80gb", "--gpus", "8", "--tp", "8"],
    ],
)
def test_piped_lines_fit_120_columns(capsys: Any, args: list[str]) -> None:
    capsys.readouterr()
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= PIPED_WIDTH, max(lines, key=len)


def test_fit_lines_wraps_with_the_line_s_indent() -> None:
    lines = fit_lines(["  " + "word " * 40, "short"], width=50)
    assert lines[0] == "  " + " ".join(["word"] * 9) and lines[-1] == "short"
    assert all(len(line) <= 50 for line in lines) and all(line.startswith("      word") for line in lines[1:-1])
    assert sum(line.split().count("word") for line in lines) == 40
