"""``vramlens activations``: hooked leaf-module outputs of a tiny Llama, counted by hand.

Tiny Llama: hidden h = 64, intermediate i = 172, 2 layers, 4 heads of head_dim 16, 2 KV
heads (kv = 2 x 16 = 32), vocab V = 128, untied. Per token, each decoder layer's leaf
modules output: input_layernorm h, q_proj h, k_proj kv, v_proj kv, o_proj h,
post_attention_layernorm h, gate_proj i, act_fn i, up_proj i, down_proj h
= 5 x 64 + 2 x 32 + 3 x 172 = 900 elements. Outside the layers: embed_tokens h, the final
norm h, lm_head V, and the rotary table (cos and sin of shape 1 x seq x head_dim, shared by
the batch: 2 x 16 / batch per token).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import requires_hf, tiny_llama_config
from vramlens.cli import main

pytestmark = [requires_hf, pytest.mark.hf]

H, INTER, KV, V, HEAD_DIM, LAYERS = 64, 172, 32, 128, 16, 2
BATCH, SEQ = 2, 8
TOKENS = BATCH * SEQ

#: Per-token output elements of each leaf module (layer modules: per layer).
LAYER_MODULES = {
    "input_layernorm": H,
    "self_attn.q_proj": H,
    "self_attn.k_proj": KV,
    "self_attn.v_proj": KV,
    "self_attn.o_proj": H,
    "post_attention_layernorm": H,
    "mlp.gate_proj": INTER,
    "mlp.act_fn": INTER,
    "mlp.up_proj": INTER,
    "mlp.down_proj": H,
}
OTHER_MODULES = {"model.embed_tokens": H, "model.norm": H, "lm_head": V}
ROTARY = 2 * HEAD_DIM * SEQ  # cos + sin for the whole forward (1 x seq x head_dim each)
PER_LAYER = 5 * 64 + 2 * 32 + 3 * 172  # 900
#: Parameters: embedding + head 2 x 128 x 64; per layer q, o 64 x 64, k, v 64 x 32, three MLP 64 x 172, two norms 64.
PARAMETERS = 2 * 128 * 64 + LAYERS * (2 * 4096 + 2 * 2048 + 3 * 11008 + 2 * 64) + 64  # 107,328


def tiny() -> dict[str, Any]:
    return tiny_llama_config(intermediate_size=INTER, vocab_size=V)


def count(**options: Any) -> Any:
    from vramlens.simulator.activations import count_activations

    return count_activations(tiny(), batch=options.pop("batch", BATCH), seq=options.pop("seq", SEQ), **options)


@pytest.fixture(scope="module")
def bf16() -> Any:
    return count()


def test_each_leaf_module_outputs_its_hand_counted_elements(bf16: Any) -> None:
    rows = {row.name: row for row in bf16.rows}
    expected = {name: LAYERS * per_token * TOKENS for name, per_token in LAYER_MODULES.items()}
    expected |= {name: per_token * TOKENS for name, per_token in OTHER_MODULES.items()}
    expected["model.rotary_emb"] = ROTARY
    assert {name: row.elements for name, row in rows.items()} == expected
    assert {name: row.calls for name, row in rows.items() if row.in_layers} == dict.fromkeys(LAYER_MODULES, LAYERS)
    assert {name for name, row in rows.items() if not row.in_layers} == {*OTHER_MODULES, "model.rotary_emb"}
    assert rows["self_attn.k_proj"].module_type == "Linear"
    assert rows["input_layernorm"].module_type == "LlamaRMSNorm"


def test_totals_per_token_per_layer_and_outside_the_layers(bf16: Any) -> None:
    non_layer = (H + H + V) * TOKENS + ROTARY  # 272 per token at batch 2
    assert PER_LAYER == 900
    assert bf16.per_layer_elements == (PER_LAYER * TOKENS,) * LAYERS
    assert bf16.non_layer_elements == non_layer
    assert bf16.elements == LAYERS * PER_LAYER * TOKENS + non_layer
    assert bf16.elements_per_token == 2 * 900 + 64 + 64 + 128 + 2 * 16 / BATCH == 2072
    assert bf16.by_module_type == {
        "Embedding": H * TOKENS,
        "LlamaRotaryEmbedding": ROTARY,
        "LlamaRMSNorm": (2 * LAYERS + 1) * H * TOKENS,
        "Linear": (LAYERS * (3 * H + 2 * KV + 2 * INTER) + V) * TOKENS,
        "SiLUActivation": LAYERS * INTER * TOKENS,
    }


def test_bytes_follow_the_output_dtypes() -> None:
    assert count().bytes_per_token == 2 * 2072  # bf16 everywhere
    assert count(precision="fp32").bytes_per_token == 4 * 2072
    # mixed-bf16: fp32 weights under autocast. Linears (and SiLU on their output) return bf16;
    # the embedding, the norms (cast back to their fp32 input's dtype) and the rotary tables
    # (cast to the fp32 hidden states' dtype) stay fp32.
    mixed = {row.name: row.nbytes // row.elements for row in count(precision="mixed-bf16").rows}
    fp32 = {"model.embed_tokens", "model.rotary_emb", "input_layernorm", "post_attention_layernorm", "model.norm"}
    assert mixed == {name: 4 if name in fp32 else 2 for name in mixed}


def test_rotary_tables_are_per_sequence_not_per_sample() -> None:
    single = count(batch=1)
    assert single.elements_per_token == 2 * 900 + 64 + 64 + 128 + 2 * 16
    assert single.per_layer_elements == (PER_LAYER * SEQ,) * LAYERS


def test_saved_for_backward_is_measured_and_holds_the_outputs(bf16: Any) -> None:
    logits = TOKENS * V * 2  # bf16 logits returned by the model
    loss = 4  # fp32 scalar: transformers upcasts the logits for the cross-entropy
    assert bf16.output_bytes == logits + loss
    assert bf16.saved_bytes > bf16.output_bytes
    assert bf16.saved_bytes_per_token == bf16.saved_bytes / TOKENS
    # log_softmax keeps its fp32 output (TOKENS x V x 4) for backward: more than the logits alone.
    assert bf16.saved_bytes >= logits + TOKENS * V * 4


def test_heuristic_and_ratio(bf16: Any) -> None:
    a = 4.6894e-4 * PARAMETERS + 1.8494e6
    assert bf16.num_parameters == PARAMETERS == 107_328
    assert bf16.heuristic_per_token == pytest.approx(a)
    assert bf16.heuristic_bytes_per_token == pytest.approx(a * 2)
    assert bf16.heuristic_elements_per_token == pytest.approx(a / 4)
    assert bf16.heuristic_ratio == pytest.approx(2072 * 2 / (a * 2))
    assert "Estimating Memory Requirements" in bf16.heuristic_source


def test_tied_embedding_counts_its_parameters_once() -> None:
    from vramlens.simulator.activations import count_activations

    tied = count_activations(tiny_llama_config(intermediate_size=INTER, vocab_size=V, tie_word_embeddings=True), seq=8)
    assert tied.num_parameters == PARAMETERS - V * H


@pytest.fixture
def config_path(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny()))
    return str(path)


def test_cli_text_shows_the_table_totals_saved_bytes_and_heuristic(
    config_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["activations", config_path, "--batch", "2", "--seq", "8"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "self_attn.k_proj" in out and "lm_head" in out
    assert "900 elements/token" in out  # per decoder layer
    assert "total hooked outputs:     2,072 elements/token = 4.05 KiB/token" in out
    assert "kept alive after forward" in out and "not the tensors saved for backward" in out
    assert "A = 4.6894e-4 x N + 1.8494e6" in out and "hooked outputs / heuristic = 0.001" in out


def test_cli_json_has_the_per_token_figures(config_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["activations", config_path, "--batch", "2", "--seq", "8", "--format", "json", "--precision", "fp32"])
    out, err = capsys.readouterr()
    assert status == 0, err
    data = json.loads(out)
    assert data["elements_per_token"] == 2072
    assert data["bytes_per_token"] == 4 * 2072
    assert data["per_layer_elements_per_token"] == [900, 900]
    assert data["heuristic"]["activation_bytes"] == 4
    assert data["saved_bytes_per_token"] > data["output_bytes_per_token"] > 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--seq", "abc"], "error: seq: must be an integer >= 1"),
        (["--seq", "0"], "error: seq: must be an integer >= 1"),
        (["--precision", "fp64"], "error: precision: unknown value 'fp64'"),
    ],
)
def test_cli_bad_values_are_one_line_errors(
    config_path: str, args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["activations", config_path, *args])
    out, err = capsys.readouterr()
    assert status == 2
    assert out == ""
    assert err.startswith(expected) and err.count("\n") == 1, err


@pytest.mark.slow
def test_the_guides_qwen_number_is_float32_bytes_of_every_module() -> None:
    """The guide's 5,065,216 "activations per token" for Qwen2.5-1.5B, rebuilt its way (every
    module hooked, ``numel * element_size``, float32, eval, one token): it is 4 x 1,266,304."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vramlens import load_model
    from vramlens.simulator.build import build_model, real_code_paths
    from vramlens.workload.load import load_workload
    from vramlens.workload.options import AttentionImpl

    spec = load_model("qwen2.5-1.5b")
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    model = build_model(
        spec, load_workload({"model": spec}), dtype=torch.float32, attention=AttentionImpl.SDPA, fake_mode=fake
    )
    sizes: list[int] = []

    def hook(module: Any, inputs: Any, output: Any) -> None:  # the guide's hook
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        sizes.extend(t.numel() * t.element_size() for t in outputs if isinstance(t, torch.Tensor))

    for module in model.modules():
        module.register_forward_hook(hook)
    model.eval()
    with real_code_paths(), fake, torch.no_grad():
        model(torch.zeros((1, 1), dtype=torch.int64))
    assert sum(sizes) == 5_065_216 == 4 * 1_266_304
