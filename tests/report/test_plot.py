"""Static pictures (report/plot.py, report/plot_compare.py): PNG size and colored plot area, SVG
paths per category and labels, comparisons, refused paths, and ``--plot`` on the command line."""

from __future__ import annotations

import dataclasses
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="the [plot] extra")

from conftest import requires_hf
from vramlens.categories import Category
from vramlens.cli.app import main
from vramlens.errors import InputError, MissingExtraError
from vramlens.estimator import estimate
from vramlens.report.palette import PALETTE
from vramlens.report.plot import band_path, save_comparison, save_plot
from vramlens.result.report import MemoryReport, PhaseMemory
from vramlens.result.timeline import CATEGORY_ORDER, TimelineBuilder
from vramlens.trace.timeline_io import save_timeline
from vramlens.units import GiB, MiB

SVG = "{http://www.w3.org/2000/svg}"
P, G, S, A, T = (
    Category.PARAMETERS,
    Category.GRADIENTS,
    Category.OPTIMIZER_STATE,
    Category.ACTIVATIONS,
    Category.TEMPORARY,
)
#: (ms, GiB, category, phase) of the hand-built run. Live GiB after each event:
#: 4, 5, 6, 8 (the peak, in backward), 6, 7, 6, 5, 7, 7.5, 7.
EVENTS = [
    (0, 4, P, "forward"),
    (1, 1, A, "forward"),
    (2, 1, A, "forward"),
    (3, 2, T, "backward"),
    (4, -2, T, "backward"),
    (5, 1, G, "backward"),
    (6, -1, A, "backward"),
    (7, -1, A, "backward"),
    (8, 2, S, "optimizer_step"),
    (9, 0.5, T, "optimizer_step"),
    (10, -0.5, T, "optimizer_step"),
]


def _timeline_report() -> MemoryReport:
    """A simulated-like report with a timeline, built by hand (peak 8 GiB in backward, GPU 10 GiB)."""
    builder = TimelineBuilder(time_unit="ns")
    for storage, (ms, gib, category, phase) in enumerate(EVENTS):
        builder.append(
            ms * 10**6, int(gib * GiB), CATEGORY_ORDER.index(category), storage, builder.code("phase", phase), -1, -1
        )
    timeline = builder.build(metadata={"model": "hand-built", "engine": "simulate"})
    phases = (
        PhaseMemory(name="forward", allocated_bytes=6 * GiB, breakdown={P: 4 * GiB, A: 2 * GiB}),
        PhaseMemory(name="backward", allocated_bytes=8 * GiB, breakdown={P: 4 * GiB, A: 2 * GiB, T: 2 * GiB}),
        PhaseMemory(name="optimizer_step", allocated_bytes=7 * GiB, breakdown={P: 4 * GiB, G: GiB, S: 2 * GiB}),
    )
    return MemoryReport(
        engine="simulate", model="hand-built", workload={}, phases=phases, peak_phase="backward",
        allocated_bytes=8 * GiB, reserved_bytes=8 * GiB + 512 * MiB, device_bytes=9 * GiB,
        gpu="test-gpu", capacity_bytes=10 * GiB, timeline=timeline,
    )  # fmt: skip


def _estimate() -> MemoryReport:
    return estimate({"model": "llama-3.2-1b", "gpu": "a100-80gb"})


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header (the IHDR chunk follows the 8-byte signature)."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def _pixels_of(path: Path, category: Category, *, left_share: float) -> int:
    """Pixels in the left ``left_share`` of the picture with exactly the category's color."""
    import matplotlib.image

    rgb = np.round(matplotlib.image.imread(path)[..., :3] * 255).astype(int)
    color = [int(PALETTE[category].hex[i : i + 2], 16) for i in (1, 3, 5)]
    region = rgb[:, : int(rgb.shape[1] * left_share)]
    return int(np.all(np.abs(region - color) <= 1, axis=-1).sum())


def _svg(path: Path) -> ET.Element:
    return ET.parse(path).getroot()


def _groups(root: ET.Element, prefix: str) -> dict[str, ET.Element]:
    return {g.get("id", ""): g for g in root.iter(f"{SVG}g") if g.get("id", "").startswith(prefix)}


def _texts(root: ET.Element) -> list[str]:
    return ["".join(text.itertext()) for text in root.iter(f"{SVG}text")]


def test_png_has_the_requested_size_and_every_large_band_is_drawn(tmp_path: Path) -> None:
    report = _estimate()
    written = save_plot(report, tmp_path / "estimate.png", width_px=900, height_px=500)
    assert written == tmp_path / "estimate.png" and _png_size(written) == (900, 500)
    # The bars of the estimate's phases (left of the breakdown): each category over 5% of the
    # peak (parameters 4.6, optimizer state 9.2, activations 15.9, temporary 18.0 of 47.8 GiB)
    # covers at least a few hundred pixels in its exact palette color.
    peak = report.peak.breakdown
    large = [c for c, b in peak.items() if b > 0.05 * sum(peak.values())]
    assert set(large) == {P, S, A, T}
    for category in large:
        assert _pixels_of(written, category, left_share=0.6) > 300, category
    # a category absent from the report is nowhere in the picture
    assert _pixels_of(written, Category.KV_CACHE, left_share=1.0) == 0


def test_timeline_png_draws_the_stacked_area(tmp_path: Path) -> None:
    written = save_plot(_timeline_report(), tmp_path / "run.png", width_px=800, height_px=400, dpi=80)
    assert _png_size(written) == (800, 400)
    for category in (P, G, S, A, T):
        assert _pixels_of(written, category, left_share=0.6) > 50, category


def test_timeline_svg_has_one_path_per_visible_category_and_the_labels(tmp_path: Path) -> None:
    root = _svg(save_plot(_timeline_report(), tmp_path / "run.svg"))
    groups = _groups(root, "area-")
    assert sorted(groups) == sorted(f"area-{c.value}" for c in (P, G, S, A, T))
    for gid, group in groups.items():
        assert len(list(group.iter(f"{SVG}path"))) == 1, gid
    texts = _texts(root)  # text stays text (svg.fonttype none)
    assert "peak 8.0 GiB in backward" in texts
    assert "test-gpu: 10.0 GiB" in texts
    assert {"forward", "backward", "optimizer step"} <= set(texts)  # the phase bands' names
    assert "hand-built - simulate (tensor level)" in texts[0] or any("hand-built - simulate" in t for t in texts)
    # the breakdown at the peak: one bar per category plus allocator slack (512 MiB) and runtime (512 MiB)
    bars = _groups(root, "bar-")
    assert sorted(bars) == sorted(
        f"bar-{c}" for c in ("parameters", "activations", "temporary", "allocator_slack", "runtime")
    )


def test_estimate_svg_draws_one_compound_path_per_category_over_the_phases(tmp_path: Path) -> None:
    report = _estimate()
    root = _svg(save_plot(report, tmp_path / "estimate.svg"))
    present = {c for phase in report.phases for c, b in phase.breakdown.items() if b}
    assert present == {P, G, S, A, T, Category.INPUTS, Category.OTHER}
    groups = _groups(root, "area-")
    assert sorted(groups) == sorted(f"area-{c.value}" for c in present)
    for group in groups.values():
        assert len(list(group.iter(f"{SVG}path"))) == 1
    # parameters are in all three phases: three rectangles (5 vertices each) in one path
    (path,) = groups["area-parameters"].iter(f"{SVG}path")
    assert path.get("d", "").count("M") == 3 and path.get("d", "").count("z") == 3
    texts = _texts(root)
    assert "peak 47.8 GiB in backward" in texts  # 51,280,535,552 B / 2**30 = 47.76
    assert {"forward", "backward", "optimizer step"} <= set(texts)


def test_band_path_outlines_only_the_stretches_with_bytes() -> None:
    xs = np.arange(6, dtype=np.float64)
    bottom = np.zeros(6)
    top = np.array([0.0, 2.0, 2.0, 0.0, 1.0, 0.0])
    path = band_path(xs, bottom, top)
    # two stretches: points 1-2 and point 4, each a closed polygon (up along top, back along bottom)
    assert path.codes.tolist() == [1, 2, 2, 2, 79, 1, 2, 79]
    assert path.vertices.tolist() == [
        [1, 2], [2, 2], [2, 0], [1, 0], [1, 2],
        [4, 1], [4, 0], [4, 1],
    ]  # fmt: skip


def test_same_report_gives_the_same_svg(tmp_path: Path) -> None:
    import matplotlib

    keys = ("svg.fonttype", "svg.hashsalt", "font.size", "axes.titlesize")
    before = [matplotlib.rcParams[key] for key in keys]
    report = _timeline_report()
    first, second = save_plot(report, tmp_path / "a.svg"), save_plot(report, tmp_path / "b.svg")
    assert first.read_bytes() == second.read_bytes()
    assert [matplotlib.rcParams[key] for key in keys] == before  # the settings do not leak out


def test_pyplot_is_never_imported(tmp_path: Path) -> None:
    """pyplot's global figures and backend switching stay out of the library (fresh interpreter)."""
    code = (
        "import sys, vramlens\n"
        "from vramlens.report.plot import save_comparison, save_plot\n"
        "report = vramlens.estimate({'model': 'llama-3.2-1b'})\n"
        f"save_plot(report, {str(tmp_path / 'a.png')!r}); save_comparison([report], {str(tmp_path / 'b.svg')!r})\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_comparison_stacks_each_peak_breakdown_with_its_total(tmp_path: Path) -> None:
    reports = [_estimate(), _timeline_report()]
    png = save_comparison(reports, tmp_path / "compare.png", labels=["estimate", "by hand"])
    assert _png_size(png) == (1000, 650)
    root = _svg(save_comparison(reports, tmp_path / "compare.svg", labels=["estimate", "by hand"]))
    groups = _groups(root, "compare-")
    # estimate at backward: P S A T inputs other + slack + runtime; the hand-built one: P A T + slack + runtime
    expected = {"parameters", "optimizer_state", "activations", "temporary", "inputs", "other"}
    assert sorted(groups) == sorted(f"compare-{c}" for c in expected | {"allocator_slack", "runtime"})
    assert all(len(list(g.iter(f"{SVG}path"))) == 1 for g in groups.values())
    # parameters appear in both bars: one path with two rectangles
    (path,) = groups["compare-parameters"].iter(f"{SVG}path")
    assert path.get("d", "").count("M") == 2
    texts = _texts(root)
    # each bar reaches its device level (the estimate's, in GiB with one decimal); 9 GiB
    estimated = f"{reports[0].device_bytes / 2**30:.1f} GiB"
    assert {estimated, "9.0 GiB", "estimate", "by hand"} <= set(texts)


def test_comparison_labels_must_match_the_reports(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        save_comparison([_estimate()], tmp_path / "c.png", labels=["a", "b"])
    assert str(info.value) == "labels: 2 labels for 1 reports; pass one label per report"


@pytest.mark.parametrize("name", ["out.pdf", "out", "out.png.txt"])
def test_a_bad_suffix_is_refused_in_one_line(tmp_path: Path, name: str) -> None:
    with pytest.raises(InputError) as info:
        save_plot(_estimate(), tmp_path / name)
    message = str(info.value)
    assert "\n" not in message and message.startswith("--plot: ") and message.endswith("accepted suffixes: .png, .svg")
    assert not (tmp_path / name).exists()


def test_a_missing_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^--plot: folder .* does not exist$"):
        save_plot(_estimate(), tmp_path / "nowhere" / "out.png")


def test_without_matplotlib_the_error_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'vramlens\[plot\]'$"):
        save_plot(_estimate(), tmp_path / "out.png")


def test_estimate_cli_writes_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out.png"
    assert main(["estimate", "llama-3.2-1b", "--gpu", "a100-80gb", "--plot", str(target)]) == 0
    assert _png_size(target) == (1400, 700)
    assert f"plot: written to {target}" in capsys.readouterr().err


def test_estimate_cli_refuses_a_bad_suffix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "llama-3.2-1b", "--plot", str(tmp_path / "out.jpg")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --plot: ") and ".png, .svg" in err


def test_view_cli_draws_a_saved_timeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = save_timeline(_timeline_report().timeline, tmp_path / "run.npz")  # type: ignore[arg-type]
    target = tmp_path / "run.svg"
    assert main(["view", str(run), "--plot", str(target)]) == 0, capsys.readouterr().err
    root = _svg(target)
    assert sorted(_groups(root, "area-")) == sorted(f"area-{c.value}" for c in (P, G, S, A, T))
    assert "peak 8.0 GiB in backward" in _texts(root)


@requires_hf
@pytest.mark.hf
@pytest.mark.slow
def test_compare_cli_draws_estimate_and_simulation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
                    "max_position_embeddings": 1024})
    )  # fmt: skip
    target = tmp_path / "compare.svg"
    args = ["compare", str(config), "--batch", "2", "--seq", "32", "--format", "json", "--plot", str(target)]
    assert main(args) == 0, capsys.readouterr().err
    texts = _texts(_svg(target))
    assert "estimate" in texts and "simulate" in texts


@pytest.mark.parametrize("name", ["estimate-llama-3.1-8b.png", "measured-timeline.png"])
def test_readme_shows_the_committed_pictures(name: str) -> None:
    """README's pictures were made by save_plot (its default 1400 x 700) and stay small."""
    from conftest import REPO_ROOT

    picture = REPO_ROOT / "docs" / "images" / name
    assert f"](docs/images/{name})" in (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert _png_size(picture) == (1400, 700) and picture.stat().st_size < 200_000


def test_names_from_files_are_drawn_as_plain_text(tmp_path: Path) -> None:
    """A model or phase name with TeX or markup (from an untrusted file) is shown literally."""
    report = _timeline_report()
    hostile = r"$\frac{a}{b}$ <script>alert(1)</script> $\nocommand{$"  # valid and invalid TeX
    timeline = dataclasses.replace(report.timeline, phases=(hostile, "backward", "optimizer_step"))  # type: ignore[type-var]
    phases = tuple(dataclasses.replace(p, name=hostile) if p.name == "forward" else p for p in report.phases)
    odd = dataclasses.replace(report, model=hostile, phases=phases, timeline=timeline)
    root = _svg(save_plot(odd, tmp_path / "odd.svg"))
    assert not list(root.iter(f"{SVG}script"))
    assert any(text.startswith(f"{hostile} - simulate") for text in _texts(root))
    assert hostile in _texts(root)  # the first phase band's name
    assert _png_size(save_plot(odd, tmp_path / "odd.png")) == (1400, 700)


def test_the_inference_subtitle_shows_the_inference_settings() -> None:
    """It said 'infer | full | batch 4 x seq 2048', training keys an inference run does not read."""
    from vramlens.estimator import estimate
    from vramlens.report.plot import workload_facts

    hf = estimate({"model": "llama-3.1-8b", "mode": "infer", "prompt": 512, "generate": 64, "quant": "nf4"})
    assert workload_facts(hf) == ["infer", "hf", "batch 4 x prompt 512 + generate 64", "mixed-bf16", "weights nf4"]
    vllm = estimate({"model": "llama-3.1-8b", "mode": "infer", "framework": "vllm", "context": 8192, "kv_dtype": "fp8"})
    assert workload_facts(vllm) == ["infer", "vllm", "batch 4 x context 8192", "mixed-bf16", "KV fp8"]
