"""The import budget of ``vramlens estimate MODEL``: the modules a cold estimate may load.

The command must start fast (issue 23: at most 0.3x llm-analysis, ``benchmarks/cold_start.py``),
so what it imports is held to a list. A fresh interpreter runs the CLI's ``main`` for the
default text output of a training estimate, and then:

* every ``vramlens`` module it loaded must be in :data:`ALLOWED` (an eager import of the
  simulator, the planner, the web server, another family's parser ... fails here: make it lazy,
  or add it here and say in the commit why the estimate needs it);
* none of :data:`FORBIDDEN` may be loaded at all (torch, transformers, matplotlib, the web
  stack, asyncio, unittest: each costs 50 ms to seconds of start-up and none is needed; numpy,
  rich, logging, difflib and importlib.resources cost 2-100 ms each and the piped text output
  of an estimate needs none of them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

#: Every vramlens module ``vramlens estimate llama-3.1-8b --mode train`` may load.
ALLOWED = frozenset(
    {
        "vramlens",
        "vramlens._compat",
        "vramlens._dataclass_cache",
        "vramlens._files",
        "vramlens._lazy",
        "vramlens._notes",
        "vramlens._records",
        "vramlens._untrusted",
        "vramlens._version",
        "vramlens.allocator",
        "vramlens.allocator._alloc_conf",
        "vramlens.allocator._blocks",
        "vramlens.allocator._caching",
        "vramlens.allocator._replay",
        "vramlens.allocator.pattern",
        "vramlens.allocator.replaying",
        "vramlens.allocator.streams",
        "vramlens.categories",
        "vramlens.cli",
        "vramlens.cli._from",
        "vramlens.cli._output",
        "vramlens.cli._pictures",
        "vramlens.cli.app",
        "vramlens.cli.estimate",
        "vramlens.dtypes",
        "vramlens.errors",
        "vramlens.estimator",
        "vramlens.estimator.act_fns",
        "vramlens.estimator.activations",
        "vramlens.estimator.eager_attention",
        "vramlens.estimator.autocast_casts",
        "vramlens.estimator.expert_lora",
        "vramlens.estimator.embedding_grads",
        "vramlens.estimator.final_norm",
        "vramlens.estimator.fsdp",
        "vramlens.estimator.zero3",
        "vramlens.estimator.zero3_terms",
        "vramlens.estimator.hook_step",
        "vramlens.estimator.layer_script",
        "vramlens.estimator.layout",
        "vramlens.estimator.phase_instant",
        "vramlens.estimator.logits",
        "vramlens.estimator.logits_terms",
        "vramlens.estimator.lora_head",
        "vramlens.estimator.loss_outputs",
        "vramlens.estimator.loss_pattern",
        "vramlens.estimator.margins",
        "vramlens.estimator.memo_keys",
        "vramlens.estimator.mlp_working",
        "vramlens.estimator.mixers",
        "vramlens.estimator.mixers.deltanet",
        "vramlens.estimator.mixers.mamba",
        "vramlens.estimator.moe_dense",
        "vramlens.estimator.moe_parts",
        "vramlens.estimator.offload",
        "vramlens.estimator.optimizers",
        "vramlens.estimator.outside_layers",
        "vramlens.estimator.paged",
        "vramlens.estimator.qlora",
        "vramlens.estimator.quantities",
        "vramlens.estimator.recompute",
        "vramlens.estimator.ring_attention",
        "vramlens.estimator.reserved",
        "vramlens.estimator.runtime",
        "vramlens.estimator.saved_parts",
        "vramlens.estimator.score_chains",
        "vramlens.estimator.stage_memory",
        "vramlens.estimator.stage_plan",
        "vramlens.estimator.step_fsdp2",
        "vramlens.estimator.step_layers",
        "vramlens.estimator.step_pattern",
        "vramlens.estimator.step_phases",
        "vramlens.estimator.step_shape",
        "vramlens.estimator.step_weights",
        "vramlens.estimator.training",
        "vramlens.estimator.training_cache",
        "vramlens.estimator.trl_head",
        "vramlens.estimator.vision",
        "vramlens.estimator.weight_format",
        "vramlens.hardware",
        "vramlens.model",
        "vramlens.model.breakdown",
        "vramlens.model.catalog",
        "vramlens.model.components",
        "vramlens.model.config_reader",
        "vramlens.model.families",
        "vramlens.model.families._common",
        "vramlens.model.families.aliases",
        "vramlens.model.families.llama",
        "vramlens.model.hub_cache",
        "vramlens.model.modules",
        "vramlens.model.params",
        "vramlens.model.quant_formats",
        "vramlens.model.quantization",
        "vramlens.model.resolve",
        "vramlens.model.spec",
        "vramlens.model.ssm",
        "vramlens.model.vision",
        "vramlens.report",
        "vramlens.report.blocks",
        "vramlens.report.console",
        "vramlens.report.palette",
        "vramlens.report.points",
        "vramlens.report.serving_text",
        "vramlens.report.styled",
        "vramlens.report.text",
        "vramlens.report.timeline_layout",
        "vramlens.report.timeline_text",
        "vramlens.resolve",
        "vramlens.resolve._memo",
        "vramlens.resolve.attention",
        "vramlens.resolve.context",
        "vramlens.resolve.derived",
        "vramlens.resolve.frameworks",
        "vramlens.resolve.kbit",
        "vramlens.resolve.kernels",
        "vramlens.resolve.zero",
        "vramlens.resolve.styles",
        "vramlens.result",
        "vramlens.result.report",
        "vramlens.result.settings",
        "vramlens.units",
        "vramlens.workload",
        "vramlens.workload._range",
        "vramlens.workload._strings",
        "vramlens.workload.keys",
        "vramlens.workload.load",
        "vramlens.workload.options",
        "vramlens.workload.ranges",
        "vramlens.workload.sources",
        "vramlens.workload.sources._formats",
        "vramlens.workload.spec",
        "vramlens.workload.versions",
    }
)
#: Top-level packages the estimate must never load.
FORBIDDEN = (
    "torch",
    "transformers",
    "peft",
    "matplotlib",
    "fastapi",
    "starlette",
    "uvicorn",
    "asyncio",
    "unittest",
    "numpy",  # the phase chart is laid out in plain Python (report/points.py, report/timeline_layout.py)
    "rich",  # piped output is laid out without rich (report/blocks.py); a terminal still loads it for colors
    "logging",  # notes import it when one is emitted (vramlens/_notes.py)
    "difflib",  # "did you mean" imports it on a miss
    "importlib.resources",  # package data read from the package directory (vramlens/_files.py package_data)
)

_PROBE = """
import io, json, sys, contextlib
from vramlens.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    status = main(sys.argv[1:])
print(json.dumps({"status": status, "modules": sorted(sys.modules)}))
"""


def _loaded(*args: str) -> tuple[int, list[str]]:
    """Exit status and ``sys.modules`` of a fresh interpreter that ran ``vramlens ARGS``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, env=env, check=True, timeout=120
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["status"], result["modules"]


@pytest.fixture(scope="module")
def estimate_modules() -> list[str]:
    status, modules = _loaded("estimate", "llama-3.1-8b", "--mode", "train")
    assert status == 0
    return modules


def test_the_estimate_loads_only_allowed_vramlens_modules(estimate_modules: list[str]) -> None:
    extra = sorted(name for name in estimate_modules if name.split(".")[0] == "vramlens" and name not in ALLOWED)
    assert not extra, f"vramlens estimate now also imports {extra}; import them where they are used"


@pytest.mark.parametrize("package", FORBIDDEN)
def test_the_estimate_loads_no_heavy_package(estimate_modules: list[str], package: str) -> None:
    loaded = [name for name in estimate_modules if name == package or name.startswith(package + ".")]
    assert not loaded, f"vramlens estimate imports {loaded[:5]}"


def test_the_budget_check_sees_an_added_import() -> None:
    """The probe itself works: a command that does load the simulator shows it (so the checks
    above could fail)."""
    _, modules = _loaded("simulate", "--help")
    assert any(name.startswith("vramlens.simulator") or name == "vramlens.cli.simulate" for name in modules)
    assert "vramlens.cli.simulate" not in ALLOWED
