"""The technique registry: labels, combinations, the workload keys each sets, and the
one-line refusal of a technique whose package this machine lacks."""

from __future__ import annotations

import importlib.util

import pytest

from vramlens.errors import InputError
from vramlens.experiments.techniques import (
    TECHNIQUES,
    TechniqueName,
    combo_label,
    parse_combo,
    parse_technique,
    unavailable_reason,
    workload_keys,
)


def test_every_technique_parses_from_its_label() -> None:
    for name, technique in TECHNIQUES.items():
        label = f"{name}=0.5" if technique.takes_value else str(name)
        assert parse_technique(label).label == label


def test_combination_is_in_registry_order_and_merges_workload_keys() -> None:
    combo = parse_combo("fused-optimizer+checkpoint+bf16")
    assert combo_label(combo) == "bf16+checkpoint+fused-optimizer"
    assert workload_keys(combo) == {"precision": "bf16", "recompute": "full", "optimizer_in_backward": True}
    assert workload_keys(parse_combo("memory-budget=0.05")) == {"compile": True}
    assert parse_combo("memory-budget=0.05")[0].value == 0.05
    assert combo_label(parse_combo("control")) == combo_label(parse_combo([])) == "control"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bf17", r"^techniques: unknown technique 'bf17'; accepted: bf16, checkpoint, compile, .*memory-budget=X"),
        ("memory-budget", r"^techniques: memory-budget needs value"),
        ("memory-budget=2", r"^techniques: memory-budget=2; accepted: a number in \(0, 1\]"),
        ("memory-budget=x", r"^techniques: 'memory-budget=x': the value must be a number"),
        ("bf16=1", r"^techniques: bf16 takes no value"),
        ("bf16+bf16", r"^techniques: bf16 given twice in one run"),
    ],
)
def test_bad_labels_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_combo(text)


def test_8bit_optimizer_is_refused_where_bitsandbytes_does_not_import(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "bitsandbytes" else real(name))
    assert unavailable_reason(parse_combo("bf16+8bit-optimizer")) == (
        "8bit-optimizer: bitsandbytes is not available on this machine"
    )
    assert unavailable_reason(parse_combo("bf16+checkpoint")) is None
    assert TECHNIQUES[TechniqueName.OPTIMIZER_8BIT].workload == {"optimizer": "adamw-8bit"}
