"""Terminal (rich) and Markdown views of a report: every category shown, bars proportional to share."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from rich.console import Console

from vramlens.categories import Category
from vramlens.estimator import estimate
from vramlens.report.text import markdown_report, print_report, report_renderable
from vramlens.result.report import MemoryReport, PhaseMemory, Term
from vramlens.units import GiB, format_bytes

MODEL = "llama-3.1-8b"

WORKLOADS: dict[str, dict[str, Any]] = {
    "full single GPU": {"model": MODEL},
    "lora": {"model": MODEL, "method": "lora"},
    "qlora": {"model": MODEL, "method": "qlora"},
    "fsdp 8 GPUs": {"model": MODEL, "parallel": {"gpus": 8, "shard": "fsdp"}},
    "pipeline 4 stages": {"model": MODEL, "parallel": {"gpus": 4, "pp": 4}},
}

#: A breakdown row of the terminal table: category, memory, share, bar.
ROW = re.compile(r"^\s*([a-z][a-z ]*?)\s+(-?[\d.]+ (?:[KMGT]i)?B)\s+([\d.]+)%\s+(█+|▏)\s*$")


def render(report: MemoryReport, *, explain: bool = False) -> str:
    console = Console(file=io.StringIO(), width=120, color_system=None, force_terminal=False, highlight=False)
    console.print(report_renderable(report, explain=explain))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(text, str) and "\x1b[" not in text
    return text


def breakdown_rows(text: str) -> dict[str, tuple[str, float, int]]:
    """Category (underscored) -> (memory, share in percent, bar cells) from the rendered table."""
    rows: dict[str, tuple[str, float, int]] = {}
    for line in text.splitlines():
        match = ROW.match(line)
        if match:
            name, memory, share, bar = match.groups()
            rows[name.replace(" ", "_")] = (memory, float(share), 0 if bar == "▏" else len(bar))
    return rows


def shown_categories(report: MemoryReport) -> set[str]:
    return {c.value for c, b in report.breakdown.items() if b} | {"allocator_slack", "runtime"}


@pytest.fixture(scope="module", params=sorted(WORKLOADS))
def report(request: pytest.FixtureRequest) -> MemoryReport:
    return estimate(WORKLOADS[request.param])


def test_terminal_view_shows_every_category_phase_and_level(report: MemoryReport) -> None:
    text = render(report)
    rows = breakdown_rows(text)
    assert set(rows) == shown_categories(report)
    for category, value in report.breakdown.items():
        if value:
            assert rows[category.value][0] == format_bytes(value)
    assert rows["allocator_slack"][0] == format_bytes(report.allocator_slack_bytes)
    assert rows["runtime"][0] == format_bytes(report.runtime_bytes)
    for phase in report.phases:
        assert re.search(
            rf"^\s*{re.escape(phase.name)}( <- peak)?\s+{re.escape(format_bytes(phase.allocated_bytes))}", text, re.M
        )
    assert f"{report.peak_phase} <- peak" in text
    for level in ("allocated", "reserved", "device"):
        assert re.search(rf"^\s*{level}\s+{re.escape(format_bytes(getattr(report, level + '_bytes')))}", text, re.M)


def test_terminal_bars_scale_with_share(report: MemoryReport) -> None:
    rows = breakdown_rows(render(report))
    shares = {name: share for name, (_, share, _) in rows.items()}
    bars = {name: cells for name, (_, _, cells) in rows.items()}
    largest = max(shares, key=lambda name: shares[name])
    assert bars[largest] == max(bars.values()) > 0
    for a in rows:
        for b in rows:
            if shares[a] > shares[b]:
                assert bars[a] >= bars[b], (a, b)
    # the shares are of the device level: categories + allocator slack + runtime make the whole
    assert sum(shares.values()) == pytest.approx(100.0, abs=0.1 * len(shares))


def test_markdown_contains_every_category_and_phase(report: MemoryReport) -> None:
    markdown = markdown_report(report)
    lines = markdown.splitlines()
    assert lines[0] == f"### {report.model}: {format_bytes(report.device_bytes)} per GPU"
    for category, value in report.breakdown.items():
        if value:
            assert f"| {category.value} | {format_bytes(value)} |" in lines
    for phase in report.phases:
        assert f"| {phase.name} | {format_bytes(phase.allocated_bytes)} |" in lines
    assert f"| device | {format_bytes(report.device_bytes)} |" in lines
    for note in report.assumptions:
        assert f"- {note}" in lines
    rows = [line for line in lines if line.startswith("|")]
    assert all(line.endswith("|") for line in rows)
    separators = [i for i, line in enumerate(lines) if re.fullmatch(r"\|(-{3,}:?\|)+", line)]
    assert len(separators) == 3  # levels, breakdown, phases
    for i in separators:  # header above, same number of columns in every row of the table
        assert lines[i - 1].count("|") == lines[i].count("|") == lines[i + 1].count("|")


def toy_report(capacity: int | None = None) -> MemoryReport:
    """4 GiB activations, 2 GiB parameters, 1 GiB slack, 1 GiB runtime: shares 50/25/12.5/12.5%."""
    breakdown = {Category.ACTIVATIONS: 4 * GiB, Category.PARAMETERS: 2 * GiB, Category.GRADIENTS: 0}
    phases = (
        PhaseMemory(name="forward", allocated_bytes=6 * GiB, breakdown=breakdown, note="end of forward"),
        PhaseMemory(name="optimizer_step", allocated_bytes=3 * GiB, breakdown={Category.PARAMETERS: 3 * GiB}),
    )
    term = Term(name="activations", category=Category.ACTIVATIONS, bytes=4 * GiB, explain="2 GiB x 2 layers")
    return MemoryReport(
        engine="estimate",
        model="toy",
        workload={"model": "toy"},
        phases=phases,
        peak_phase="forward",
        allocated_bytes=6 * GiB,
        reserved_bytes=7 * GiB,
        device_bytes=8 * GiB,
        gpu=None if capacity is None else "toy-gpu",
        capacity_bytes=capacity,
        runtime={"cuda_context": GiB},
        terms=(term,),
        assumptions=("toy assumption",),
    )


def test_bars_are_proportional_on_a_hand_built_report() -> None:
    rows = breakdown_rows(render(toy_report()))
    assert set(rows) == {"activations", "parameters", "allocator_slack", "runtime"}  # zero gradients left out
    assert [rows[name][1] for name in ("activations", "parameters", "allocator_slack", "runtime")] == [
        50.0,
        25.0,
        12.5,
        12.5,
    ]
    assert rows["activations"][2] == 2 * rows["parameters"][2] > 0
    assert rows["allocator_slack"][2] == rows["runtime"][2] > 0
    markdown = markdown_report(toy_report())
    assert "| gradients |" not in markdown and "| activations | 4.00 GiB |" in markdown


def test_fit_lines_in_both_views() -> None:
    assert "no GPU given" in render(toy_report())
    assert "fits" not in markdown_report(toy_report())
    roomy = toy_report(capacity=10 * GiB)
    assert "fits toy-gpu (10.00 GiB): headroom 2.00 GiB" in render(roomy)
    assert "fits toy-gpu (10.00 GiB), headroom 2.00 GiB" in markdown_report(roomy)
    tight = toy_report(capacity=5 * GiB)
    assert "does NOT fit toy-gpu (5.00 GiB): short by 3.00 GiB" in render(tight)
    assert "does **not** fit toy-gpu (5.00 GiB)" in markdown_report(tight)


def test_explain_adds_the_terms_in_both_views() -> None:
    report = toy_report()
    assert "2 GiB x 2 layers" not in render(report) and "2 GiB x 2 layers" not in markdown_report(report)
    assert re.search(r"^\s*activations\s+4\.00 GiB\s+2 GiB x 2 layers\s*$", render(report, explain=True), re.M)
    assert "| activations | 4.00 GiB |  | 2 GiB x 2 layers |" in markdown_report(report, explain=True).splitlines()


def test_print_report_writes_to_stdout(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    print_report(toy_report(), explain=True)
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("toy - estimate: peak 8.00 GiB per GPU (device level)")
    assert "toy assumption" in out and "2 GiB x 2 layers" in out
    assert max(len(line) for line in out.splitlines()) <= 120
