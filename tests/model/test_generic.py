"""The generic reader (issue 19): any type transformers can build, described from its code.

What it reads must equal what transformers builds (the census test checks every type's
default config; here, small configs of hybrids, a pure state-space model and a model whose
layers share a block), the reading is cached (a second load imports no torch), and what it
cannot do it refuses in one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from generic_configs import SMALL, small_config

from conftest import REPO_ROOT, requires_hf
from vramlens.errors import ConfigError, MissingExtraError
from vramlens.model.families import parse_config
from vramlens.model.generic.layout import Component, layout_from_json, layout_to_json
from vramlens.model.spec import FfnKind, MixerKind

pytestmark = [requires_hf, pytest.mark.hf]


def _transformers_count(config: dict[str, Any]) -> int:
    import torch
    import transformers

    data = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(config["model_type"], **data)
        )
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("model_type", sorted(SMALL))
def test_small_configs_are_read_to_the_parameter(model_type: str) -> None:
    config = small_config(model_type)
    spec = parse_config(config, source=model_type)
    assert spec.generic is not None and spec.attention is None
    assert spec.num_parameters == _transformers_count(config)
    assert any("described from transformers' code" in note for note in spec.assumptions)


def test_a_hybrid_is_read_as_its_layer_kinds() -> None:
    spec = parse_config(small_config("qwen3_5_moe_text"), source="qwen3_5_moe_text")
    layout = spec.generic
    assert layout is not None
    assert [layer.mixer for layer in spec.layers] == [MixerKind.LINEAR_ATTENTION] * 3 + [MixerKind.ATTENTION]
    assert all(layer.ffn is FfnKind.MOE for layer in spec.layers)
    linear, full = layout.kinds
    assert "GatedDeltaNet" in linear.name and "layer_types='linear_attention'" in linear.name
    assert linear.component(Component.LINEAR_ATTENTION) and not linear.component(Component.ATTENTION)
    assert full.component(Component.ATTENTION) and not full.component(Component.LINEAR_ATTENTION)
    assert (layout.num_experts, layout.experts_per_token) == (4, 2)
    routed = spec.parameter_breakdown.moe_experts
    assert spec.active_parameters == spec.num_parameters - routed + routed * 2 // 4
    names = {shape.name for shape in linear.linears}
    assert {"linear_attn.in_proj_qkv", "linear_attn.out_proj", "mlp.shared_expert.down_proj"} <= names


def test_layers_sharing_a_block_count_it_once() -> None:
    config = small_config("zamba2")
    spec = parse_config(config, source="zamba2")
    assert spec.num_parameters == _transformers_count(config)
    assert spec.generic is not None and len(spec.generic.kinds) == 2


def test_the_layout_survives_its_json() -> None:
    layout = parse_config(small_config("qwen3_5_moe_text"), source="q").generic
    assert layout is not None
    assert layout_from_json(json.loads(json.dumps(layout_to_json(layout)))) == layout


def test_a_second_load_comes_from_the_cache_without_torch(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(small_config("qwen3_5_moe_text")))
    parse_config(json.loads(path.read_text()), source=str(path))  # fills the cache
    script = (
        "import sys, vramlens; s = vramlens.load_model(sys.argv[1]); "
        "print(s.num_parameters, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    count, torch_loaded, transformers_loaded = done.stdout.split()
    assert int(count) == parse_config(small_config("qwen3_5_moe_text")).num_parameters
    assert (torch_loaded, transformers_loaded) == ("False", "False")


def test_a_corrupt_cache_file_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VRAMLENS_CACHE_DIR", str(tmp_path))
    config = small_config("mamba2")
    first = parse_config(config, source="m")
    (file,) = (tmp_path / "recipes").glob("*.json")
    file.write_text('{"key": "garbage", "layout": [')
    assert parse_config(config, source="m").num_parameters == first.num_parameters
    assert json.loads(file.read_text())["layout"]["model_class"] == "Mamba2ForCausalLM"


def test_without_the_hf_extra_the_type_is_refused_with_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    import vramlens.model.generic as generic

    monkeypatch.setattr(generic, "find_spec", lambda name: None)
    with pytest.raises(
        MissingExtraError, match=r"^cfg: model_type 'qwen3_5_moe_text' has no native .*pip install 'vramlens\[hf\]'"
    ):
        parse_config(small_config("qwen3_5_moe_text"), source="cfg")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"model_type": "acme_net", "hidden_size": 8}, "model_type 'acme_net' is known neither to vramlens nor"),
        (
            {"model_type": "acme_net", "auto_map": {"AutoConfig": "acme.Config"}},
            "its config names its own code in auto_map, which vramlens never runs",
        ),
        ({"model_type": "qwen3_5_moe_text", "hidden_size": "wide"}, "transformers 5"),
        ({"model_type": ""}, "key 'model_type' must be a non-empty string"),
    ],
)
def test_what_cannot_be_described_is_refused_in_one_line(config: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config, source="cfg")
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_a_hostile_layer_count_is_refused_before_anything_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: building costs time per layer (9,000 small layers took a minute), so a config
    read from code may declare at most MAX_CODE_LAYERS per stack, at any nesting."""
    from vramlens.model import generic
    from vramlens.model.generic import reader

    monkeypatch.setenv("VRAMLENS_CACHE_DIR", str(tmp_path))
    built: list[str] = []
    monkeypatch.setattr(reader, "build_meta_model", lambda *args: built.append("built") or (None, ""))
    for overrides in ({"num_hidden_layers": 1_000_000}, {"vision_config": {"depth": generic.MAX_CODE_LAYERS + 1}}):
        config = {**small_config("qwen3_5_moe_text"), "layer_types": None, **overrides}
        with pytest.raises(ConfigError, match=r"at most 1,024 layers per stack") as info:
            parse_config(config, source="config.json")
        assert "\n" not in str(info.value) and (
            "1,000,000" in str(info.value) or "vision_config.depth" in str(info.value)
        )
    assert built == []
