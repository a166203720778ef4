"""The RLHF HTML page (report/rlhf_html.py): self-contained (no network, CSP), the chart's data
is the device-level series, the by-model bars and tables say what the hand report says, and
every string from the setup is escaped."""

from __future__ import annotations

import dataclasses
import html
import json
import re
from pathlib import Path

import pytest
from _rlhf_hand_reports import report

from vramlens.errors import InputError
from vramlens.report.html import CSP
from vramlens.rlhf.render.html import rlhf_html, save_rlhf_html
from vramlens.rlhf.report import Recommendation
from vramlens.units import GiB

PAYLOAD = "<script>window.__pwned=1</script>"


def data_block(page: str) -> dict[str, object]:
    found = re.search(r'<script type="application/json" id="vramlens-data">(.*?)</script>', page, re.S)
    assert found is not None
    loaded: dict[str, object] = json.loads(found.group(1))
    return loaded


def test_page_is_self_contained() -> None:
    page = rlhf_html(report())
    assert f'content="{html.escape(CSP)}"' in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing to fetch
    assert page.count("<script") == 3  # the data block, uPlot, the report's script
    assert "uPlot" in page and 'id="vl-chart"' in page


def test_chart_data_is_the_device_level_series() -> None:
    data = data_block(rlhf_html(report()))
    assert data["unit"] == "phase" and data["level"] == "device"
    assert data["total"] == [62 * GiB, 46 * GiB, 82 * GiB]
    assert data["peak"] == [2, 82 * GiB] and data["capacity"] == 80 * GiB
    assert [row[0] for row in data["phases"]] == ["generation", "scoring", "actor_training"]  # type: ignore[attr-defined]
    assert "kv_cache" in [row[0] for row in data["categories"]]  # type: ignore[attr-defined]


def test_summary_models_transitions_recommendations() -> None:
    hand = report()
    advice = Recommendation(text="offload the reference model between phases", saves_bytes=10 * GiB, changes=())
    page = rlhf_html(dataclasses.replace(hand, recommendations=(advice,)))
    assert "<dt>peak phase</dt><dd>actor_training</dd>" in page
    assert "<dd>does not fit (2.00 GiB over)</dd>" in page
    assert "PPO step, actor llama-3.2-1b on 1 x h100-80gb" in page
    # by model: the capacity mark at 80/82 of the bar, a bar segment per model with its bytes.
    assert "class='cap' style='left:97.56%'" in page
    assert page.count("title='actor: 10.00 GiB'") == 3
    assert "generation &rarr; scoring</td><td>actor</td><td>free</td>" in page
    assert "offload the reference model between phases (saves 10.00 GiB)" in page
    assert "<li>hand-made</li>" in page


def test_strings_from_the_setup_are_escaped() -> None:
    hand = report()
    actor = dataclasses.replace(hand.setup.actor, model=PAYLOAD)
    bad = dataclasses.replace(hand, setup=dataclasses.replace(hand.setup, actor=actor), assumptions=(PAYLOAD,))
    page = rlhf_html(bad)
    assert PAYLOAD not in page and "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page


def test_save_writes_and_refuses_bad_folders(tmp_path: Path) -> None:
    target = save_rlhf_html(report(), tmp_path / "step.html")
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    with pytest.raises(InputError, match="--html: cannot write"):
        save_rlhf_html(report(), tmp_path / "missing" / "step.html")
