"""The recipe route of the analytic engine (``estimate/generic*.py``, issue 19): what it refuses,
that its recipes are cached, and that once they are, an estimate imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO_ROOT, requires_hf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))

from generic_configs import small_config

pytestmark = [requires_hf, pytest.mark.hf]


@pytest.fixture(scope="module")
def hybrid() -> Any:
    from vramlens.model.families import parse_config

    return parse_config(small_config("qwen3_5_moe_text"), source="qwen3_5_moe_text")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"parallel": {"gpus": 2, "tp": 2}}, r"^parallel\.tp: 2 is not modelled for .*traced from transformers' code"),
        ({"parallel": {"gpus": 2, "cp": 2}, "seq": 64}, r"^parallel\.cp: 2 is not modelled"),
        ({"framework": "torchtitan"}, r"^framework: torchtitan is not modelled .*runs its own model code"),
        ({"compile": True}, r"^compile: true is not modelled"),
        ({"recompute": "selective"}, r"^recompute: selective is not modelled"),
        ({"mode": "infer", "engine": "vllm"}, r"^engine: vllm is not modelled .*vLLM runs its own model code"),
        ({"mode": "infer", "max_num_batched_tokens": 64}, r"^max_num_batched_tokens: chunked prefill is not modelled"),
        ({"method": "lora", "quant": "gptq-int4"}, r"^quant: gptq-int4 is not modelled .*bitsandbytes NF4"),
        ({"mode": "infer", "quant": "fp8"}, r"^quant: fp8 is not modelled .*bitsandbytes NF4 or unquantized weights"),
        ({"method": "lora", "lora": {"targets": ["lm_head"]}}, r"^lora\.targets: lm_head is not modelled .*LM head"),
    ],
)
def test_what_a_recipe_cannot_show_is_refused_in_one_line(
    hybrid: Any, overrides: dict[str, Any], expected: str
) -> None:
    from vramlens.errors import InputError
    from vramlens.estimator import estimate

    with pytest.raises(InputError, match=expected) as info:
        estimate({"model": hybrid, "batch": 1, "seq": 32, **overrides})
    assert "\n" not in str(info.value)


def test_a_quantized_checkpoint_is_not_traced_as_unquantized() -> None:
    from vramlens.errors import InputError
    from vramlens.estimator import estimate
    from vramlens.model.families import parse_config

    config = {
        **small_config("qwen3_5_moe_text"),
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    spec = parse_config(config, source="fp8")
    with pytest.raises(InputError, match=r"^quantization_config: fp8 is not modelled .*builds its weights unquantized"):
        estimate({"model": spec, "batch": 1, "seq": 32})


def test_a_model_whose_code_fails_on_fake_tensors_is_one_line(monkeypatch: pytest.MonkeyPatch, hybrid: Any) -> None:
    import importlib

    from vramlens.errors import InputError
    from vramlens.estimator import estimate

    tracer = importlib.import_module("vramlens.simulator.recipe")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("aten::nonzero: data-dependent\nsecond line")

    monkeypatch.setattr(tracer, "_training_step", broken)
    with pytest.raises(InputError, match=r"^model: cannot trace the layer recipe of .*qwen3_5_moe_text.*RuntimeError"):
        estimate({"model": hybrid, "batch": 1, "seq": 48, "precision": "fp32"})


_LORA = {"batch": 2, "seq": 64, "method": "lora", "precision": "bf16"}


def test_recipes_are_traced_once_and_reused(hybrid: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from vramlens.estimator import estimate

    workload = {"model": hybrid, **_LORA}
    first = estimate(workload)
    tracer = importlib.import_module("vramlens.simulator.recipe")
    monkeypatch.setattr(tracer, "derive_training", lambda ctx: pytest.fail("traced again"))
    hybrid.derived_cache.clear()  # not the in-memory memo: the file must answer
    assert estimate({**workload, "batch": 7}).allocated_bytes > first.allocated_bytes  # same recipe, other batch


def test_once_traced_an_estimate_imports_no_torch(tmp_path: Path) -> None:
    from vramlens.estimator import estimate
    from vramlens.model.families import parse_config

    config = small_config("qwen3_5_moe_text")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    workload = _LORA
    expected = estimate({"model": parse_config(config, source=str(path)), **workload}).allocated_bytes
    script = (
        "import json, sys, vramlens; r = vramlens.estimate({'model': sys.argv[1], **json.loads(sys.argv[2])}); "
        "print(r.allocated_bytes, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path), json.dumps(workload)], capture_output=True, text=True, cwd=REPO_ROOT
    )
    assert done.returncode == 0, done.stderr
    allocated, torch_loaded, transformers_loaded = done.stdout.split()
    assert (int(allocated), torch_loaded, transformers_loaded) == (expected, "False", "False")


def test_inference_of_a_hybrid_holds_its_recurrent_state_per_sequence(hybrid: Any) -> None:
    from vramlens.categories import Category
    from vramlens.estimator import estimate

    def run(batch: int) -> Any:
        return estimate({"model": hybrid, "mode": "infer", "batch": batch, "prompt": 64, "generate": 0})

    one, two = run(1), run(2)
    # One full-attention layer grows with the prompt (keys and values of 2 KV heads of 16, bf16);
    # the three linear-attention layers hold a state per sequence whatever its length.
    assert one.serving is not None and one.serving.kv_bytes_per_token == 2 * 2 * 16 * 2
    cache = one.phases[0].breakdown[Category.KV_CACHE]
    assert cache - 64 * one.serving.kv_bytes_per_token > 0
    assert two.phases[0].breakdown[Category.KV_CACHE] == 2 * cache


@pytest.mark.slow
def test_a_recipe_that_holds_between_lengths_serves_shorter_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from generic_configs import four_layer_config

    from vramlens.estimator import estimate
    from vramlens.model.families import parse_config
    from vramlens.simulator import simulate

    spec = parse_config(four_layer_config("stablelm"), source="stablelm")
    estimate({"model": spec, "batch": 2, "seq": 256, "precision": "bf16"})
    tracer = importlib.import_module("vramlens.simulator.recipe")
    monkeypatch.setattr(tracer, "derive_training", lambda ctx: pytest.fail("traced again"))
    shorter = {"model": spec, "batch": 3, "seq": 96, "precision": "bf16"}
    estimated = estimate(shorter).allocated_bytes
    monkeypatch.undo()
    assert estimated == pytest.approx(simulate(shorter).allocated_bytes, rel=0.01)
