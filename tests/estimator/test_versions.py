"""Version-dependent behaviour (``vramlens.workload.versions``): one table, each rule's effect by hand.

Each rule names the release that introduced today's behaviour; a workload whose ``versions``
predate it gets the old behaviour, said in its assumptions. Expected differences:

* ``loss_upcast`` (transformers < 4.46): the kept logits are fp32, not bf16: + b*s*V*2 bytes;
* ``logits_to_keep`` (< 4.45): the prefill's logits cover every prompt position:
  b*prompt*V*(2 + 4) bytes instead of b*V*(2 + 4);
* ``generate_cache`` (< 4.42): the decode step holds a second whole cache instead of one layer's copy;
* ``sdpa_default`` (< 4.36): attention auto is eager (the s x s probabilities are kept);
* ``lazy_module_loading`` (torch < 1.13): the CUDA context is 1000 MiB;
* ``cudagraphs_in_budget`` (vllm < 0.21): CUDA graphs come on top of the budget, so the KV pool
  is larger by them.
"""

from __future__ import annotations

import importlib.metadata
import re

import pytest

from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.estimator import estimate
from vramlens.estimator.infer.engines import VLLM
from vramlens.model.resolve import load_model
from vramlens.result.report import MemoryReport
from vramlens.workload.load import load_workload
from vramlens.workload.versions import CURRENT, PACKAGES, VERSION_RULES, older_than, parse_version, resolved_versions

MiB = 1 << 20
OLD = {"transformers": "4.35", "torch": "1.12", "vllm": "0.6"}


def test_every_rule_names_a_known_package_a_release_and_its_change() -> None:
    for rule in VERSION_RULES.values():
        assert rule.package in PACKAGES
        assert parse_version(rule.since) is not None
        assert rule.before and re.search(r"#\d+|v\d|vLLM \d", rule.change), rule.name


def test_versions_default_to_the_installed_package_else_the_current_release() -> None:
    found = resolved_versions(())
    assert found["transformers"] == importlib.metadata.version("transformers")
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        assert found["vllm"] == CURRENT["vllm"]
    assert resolved_versions((("transformers", "4.35"),))["transformers"] == "4.35"
    assert parse_version("4.46.0.dev0") == (4, 46, 0) and parse_version("x") is None
    assert older_than((("transformers", "4.45.2"),), "loss_upcast")
    assert not older_than((("transformers", "4.46"),), "loss_upcast")


def _train(**versions: str) -> MemoryReport:
    return estimate({"model": "llama-3.2-1b", "precision": "bf16", "batch": 2, "seq": 1024,
                     "attention": "sdpa", "versions": versions})  # fmt: skip


def test_loss_upcast_keeps_fp32_logits_before_4_46() -> None:
    spec = load_model("llama-3.2-1b")
    new, old = _train(transformers="4.46"), _train(transformers="4.45")
    assert old.allocated_bytes - new.allocated_bytes == 2 * 1024 * spec.vocab_size * (4 - 2)
    assert any("4.45 < 4.46" in note for note in old.assumptions)


def test_sdpa_became_the_default_attention_in_4_36() -> None:
    workload = {"model": "llama-3.2-1b", "precision": "bf16", "batch": 1, "seq": 1024}
    old = estimate({**workload, "versions": {"transformers": "4.35"}})
    new = estimate({**workload, "versions": {"transformers": "4.36"}})
    assert old.breakdown[Category.ACTIVATIONS] > new.breakdown[Category.ACTIVATIONS]
    assert any("attention auto meant eager" in note for note in old.assumptions)


def _infer(**versions: str) -> MemoryReport:
    return estimate({"model": "llama-3.2-1b", "mode": "infer", "precision": "bf16", "batch": 2, "prompt": 2048,
                     "generate": 64, "attention": "sdpa", "versions": versions})  # fmt: skip


def _phase(report: MemoryReport, name: str) -> dict[Category, int]:
    return dict(next(phase for phase in report.phases if phase.name == name).breakdown)


def test_prefill_logits_of_every_position_before_4_45() -> None:
    vocab = load_model("llama-3.2-1b").vocab_size
    new, old = _infer(transformers="4.45"), _infer(transformers="4.44")
    assert _phase(new, "prefill").get(Category.TEMPORARY, 0) <= 2 * vocab * (2 + 4)
    assert old.allocated_bytes >= 2 * 2048 * vocab * (2 + 4)
    assert any("logits of every prompt position" in note for note in old.assumptions)


def test_the_legacy_generate_cache_holds_two_caches_before_4_42() -> None:
    new, old = _infer(transformers="4.42"), _infer(transformers="4.41")
    kv = _phase(new, "decode")[Category.KV_CACHE]
    layers = load_model("llama-3.2-1b").num_layers
    assert _phase(old, "decode")[Category.TEMPORARY] - _phase(new, "decode")[Category.TEMPORARY] == kv - kv // layers


def test_eager_module_loading_before_torch_1_13() -> None:
    assert _train(torch="1.12").runtime["cuda_context"] == 1000 * MiB
    assert _train(torch="1.13").runtime["cuda_context"] == 758 * MiB


def test_vllm_cuda_graphs_outside_the_budget_before_0_21() -> None:
    workload = {"model": "llama-3.1-8b", "mode": "infer", "engine": "vllm", "gpu": "h100-80gb"}
    new = estimate({**workload, "versions": {"vllm": "0.21"}})
    old = estimate({**workload, "versions": {"vllm": "0.6"}})
    assert new.serving is not None and old.serving is not None
    assert old.serving.kv_pool_bytes - new.serving.kv_pool_bytes == VLLM.cuda_graph_bytes  # type: ignore[operator]
    assert old.device_bytes - new.device_bytes == VLLM.cuda_graph_bytes


@pytest.mark.parametrize(
    ("value", "start"),
    [
        ({"numpy": "1.0"}, "versions: unknown package 'numpy'; accepted: torch, transformers, vllm"),
        ({"transformers": 4.4}, "versions.transformers: expected a quoted release number"),
        ({"transformers": "latest"}, "versions.transformers: expected a quoted release number"),
        ("transformers", "versions: expected package=version pairs"),
        (5, "versions: expected a mapping of package to version"),
    ],
)
def test_bad_versions_are_one_line_errors_naming_the_key(value: object, start: str) -> None:
    with pytest.raises(InputError) as error:
        load_workload({"model": "gpt2", "versions": value})
    assert str(error.value).startswith(start) and "\n" not in str(error.value)


def test_versions_from_flags_and_files_normalize_alike() -> None:
    flags = load_workload({"model": "gpt2", "versions": "vllm=0.6, transformers=4.35"})
    mapping = load_workload({"model": "gpt2", "versions": OLD | {"torch": "2.13"}})
    assert flags.versions == (("transformers", "4.35"), ("vllm", "0.6"))
    assert dict(mapping.versions) == OLD | {"torch": "2.13"}
