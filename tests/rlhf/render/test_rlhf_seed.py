"""The seed's model (report/rlhf_seed.py) gives the seed's own numbers, and the side-by-side script
(benchmarks/rlhf_seed_comparison.py) runs, prints both columns and every claimed difference holds."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT
from vramlens.rlhf.render.seed import SEED_MODELS, SeedScenario, seed_per_gpu, seed_phase_memory


def test_seed_formulas_by_hand() -> None:
    # 70B, batch 32, seq 2048, TP=8, decimal GB:
    #   weights 70e9 x 2 B / 8 = 17.5; Adam 70e9 x 8 B / 8 = 70.0;
    #   KV 32 x 2048 x (2 x 80 layers x 8192 hidden x 2 B) / 8 = 21.47483648;
    #   activations 32 x 2048 x 8192 x 10 x 2 B x 80 / 8 = 107.3741824; scoring takes 0.2 of it.
    per_gpu = seed_per_gpu(SeedScenario())
    generation, scoring, training = per_gpu["generation"], per_gpu["scoring"], per_gpu["training"]
    assert generation["actor weights"] == pytest.approx(17.5)
    assert generation["KV cache"] == pytest.approx(21.47483648)
    assert generation["misc (buffers)"] == 2.0  # flat, not divided by TP
    assert generation["total"] == pytest.approx(3 * 17.5 + 21.47483648 + 2.0)
    assert scoring["activations"] == pytest.approx(0.2 * 107.3741824)
    assert training["Adam states"] == pytest.approx(70.0)
    assert training["activations"] == pytest.approx(107.3741824)
    assert training["total"] == pytest.approx(4 * 17.5 + 70.0 + 107.3741824)


def test_seed_model_table_and_phases() -> None:
    assert SEED_MODELS["405b"].num_layers == 126 and SEED_MODELS["7b"].hidden_size == 4096
    whole = seed_phase_memory(SEED_MODELS["7b"], 4, 2048, "generation")
    assert whole["actor weights"] == pytest.approx(14.0)
    with pytest.raises(ValueError, match="phase"):
        seed_phase_memory(SEED_MODELS["7b"], 4, 2048, "full")


@pytest.fixture(scope="module")
def comparison() -> str:
    script = REPO_ROOT / "benchmarks" / "rlhf_seed_comparison.py"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return result.stdout


def test_comparison_script_prints_both_columns_and_its_claims_hold(comparison: str) -> None:
    header = next(line for line in comparison.splitlines() if line.startswith("phase"))
    assert "seed example" in header and "seed formulas" in header and "vramlens" in header and "swapped" in header
    kv = next(line for line in comparison.splitlines() if line.startswith("generation KV cache"))
    assert kv.split()[-4:-2] == ["20.00", "21.47"]  # the example's number, then the formula's
    assert comparison.count("[holds]") == 11 and "DOES NOT HOLD" not in comparison


def test_docs_show_the_table_the_script_prints(comparison: str) -> None:
    """docs/rlhf.md's side-by-side table is the script's output of today (rerun the script and paste
    its table when the engine changes)."""
    docs = (REPO_ROOT / "docs" / "rlhf.md").read_text(encoding="utf-8")
    block = re.findall(r"```text\n(.*?)```", docs.split("## The seed's example, side by side")[1], flags=re.S)[0]
    rows = [line for line in block.splitlines() if line.startswith(("phase", "generation", "scoring", "training"))]
    assert len(rows) == 21  # header, 17 items, 3 totals
    printed = set(comparison.splitlines())
    assert [row for row in rows if row not in printed] == []
