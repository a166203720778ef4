"""``vramlens activations``: seed 002's own figure (5,065,216 for Qwen2.5-1.5B) printed beside
vramlens's count, and the default sequence cut to the model's context (gpt2 failed with 2048)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import requires_hf
from vramlens.cli import main

pytestmark = [requires_hf, pytest.mark.slow]


def _run(capsys: Any, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_gpt2_runs_with_the_default_sequence(capsys: Any) -> None:
    status, out, err = _run(capsys, "activations", "gpt2", "--no-seed-count")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == "seq: 1024 (gpt2's context; the default 2048 is longer)"
    assert lines[1].startswith("gpt2: training forward, batch 1 x seq 1024 = 1,024 tokens")


def test_the_seeds_qwen_figure_is_printed_beside_vramlens(capsys: Any) -> None:
    status, out, err = _run(capsys, "activations", "qwen2.5-1.5b", "--seq", "16")
    assert status == 0, err
    assert "  5,065,216 per token - the guide's 'activations per token', which are bytes:" in out
    assert "  1,266,304 float32 elements over 371 modules" in out
    assert "vramlens, leaf modules only: 1,137,280 elements/token" in out
    status, out, _ = _run(capsys, "activations", "qwen2.5-1.5b", "--seq", "16", "--format", "json")
    seed = json.loads(out)["seed_count"]
    assert seed == {"bytes_per_token": 5_065_216, "elements_per_token": 1_266_304, "modules": 371}
