"""``vramlens gpus``: the table, one card by the name nvidia-smi prints, and the cards with a given memory."""

from __future__ import annotations

import json
from typing import Any

from vramlens.cli import main
from vramlens.hardware import gpu_table


def run(capsys: Any, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_lists_every_card_with_its_same_memory_cards(capsys: Any) -> None:
    status, out, _ = run(capsys, "gpus", "--format", "json")
    rows = json.loads(out)
    assert status == 0 and [row["name"] for row in rows] == [gpu.name for gpu in gpu_table()]
    by_name = {row["name"]: row for row in rows}
    assert "rtx-3090-pcie-24gb" in by_name["rtx-4090-pcie-24gb"]["same_memory"]
    status, out, _ = run(capsys, "gpus")
    shown = [line for line in out.splitlines()[1:] if not line.startswith(" ")]  # wrapped lines are indented
    assert status == 0 and out.splitlines()[0].startswith("name") and len(shown) == len(rows)


def test_one_card_by_its_nvidia_smi_name(capsys: Any) -> None:
    status, out, _ = run(capsys, "gpus", "NVIDIA H100 80GB HBM3")
    assert status == 0
    assert out.startswith("h100-sxm-80gb: NVIDIA H100 SXM5 80GB HBM3")
    assert "same memory:  h100-pcie-80gb, a100-sxm-80gb, a100-pcie-80gb" in out


def test_cards_with_a_memory_and_errors(capsys: Any) -> None:
    status, out, _ = run(capsys, "gpus", "--memory", "48GB", "--format", "json")
    assert status == 0 and {row["name"] for row in json.loads(out)} >= {"l40s-pcie-48gb", "a40-pcie-48gb"}
    status, _, err = run(capsys, "gpus", "NVIDIA GeForce RTX 9999")
    assert status == 2 and err.startswith("error: NAME: unknown GPU 'NVIDIA GeForce RTX 9999'") and err.count("\n") == 1
