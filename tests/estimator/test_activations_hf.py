"""Per-layer activation recipes against the tensors autograd really saves (transformers, CPU).

For every supported family, one decoder layer of a tiny model built from
``tests/model/family_configs.py`` is run forward with ``saved_tensors_hooks``; the
bytes per token it keeps must equal ``layer_saved_parts`` for the same settings.

Differences that come from running on CPU rather than CUDA are left out, not
tolerated silently:

* nn.LayerNorm keeps its mean and rstd in bf16 on CPU (fp32 on CUDA): 4 bytes less per
  normalized row, covered by the 1.5% tolerance of bf16 LayerNorm families;
* dropout masks are float tensors on CPU (bool on CUDA): the GPT-2 config here has its
  dropouts set to 0, and ``test_dropout_masks_are_one_byte_per_element_on_cuda`` checks the
  mask count separately;
* SDPA falls back to the math kernel on CPU, which up-casts bf16 to fp32, when CUDA would use
  the memory-efficient kernel: multi-query Falcon and MLA (different q/v head sizes) are
  compared with eager attention only;
* MoE routers that do not re-normalize their top-k weights keep 16 bytes per token less than
  the Mixtral-style count (documented over-count), within the 2% tolerance of MoE families.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import requires_hf
from vramlens.estimator.activations import layer_saved_parts
from vramlens.estimator.layout import lora_targets
from vramlens.estimator.recompute import layer_kind, layer_recipe, train_state
from vramlens.estimator.saved_parts import TrainState
from vramlens.estimator.training_cache import training_cache_parts
from vramlens.model.resolve import model_from_config
from vramlens.model.spec import LayerKind
from vramlens.resolve.context import resolve_training
from vramlens.workload.load import load_workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_configs import FAMILY_CONFIGS, HYBRID_CONFIGS

pytestmark = [requires_hf, pytest.mark.hf]

_SEQ = 64
_NO_DROPOUT_GPT2 = {**FAMILY_CONFIGS["gpt2"], "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}
# Activation functions that keep other tensors than silu's (estimate/act_fns.py): relu keeps its
# output (in a gated MLP also the product's operand, in a plain one the down projection's input).
_CONFIGS = {
    **FAMILY_CONFIGS,
    "gpt2": _NO_DROPOUT_GPT2,
    "gpt2-relu": {**_NO_DROPOUT_GPT2, "activation_function": "relu"},
    "llama-relu": {**FAMILY_CONFIGS["llama"], "hidden_act": "relu"},
    "llama-gelu-new": {**FAMILY_CONFIGS["llama"], "hidden_act": "gelu_new"},
}
# gpt-oss: transformers refuses SDPA (attention sinks); eager is its default.
_EAGER_ONLY = {"falcon-mqa", "deepseek_v2", "deepseek_v3", "gemma2", "gpt_oss", "gpt_oss-layer-types"}
_MOE = {
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "olmoe",
    "olmoe-clip-norm-topk",
    "qwen3_vl_moe",
}
_SKIP = {"gemma3", "llama4"}  # multimodal wrappers whose text decoders are covered on their own
#: Decoder layers compared, one of each kind the config has (default: layer 1).
_LAYERS = {
    "gpt_oss": (1, 2),  # full, sliding
    "gpt_oss-layer-types": (1, 3),  # sliding, full
    "smollm3-nope-sliding": (1, 2),  # NoPE sliding, RoPE full
    "smollm3": (2, 3),  # RoPE, NoPE
    "cohere2": (1, 3),  # sliding with RoPE, full NoPE
    "glm4_moe": (0, 1),  # dense, MoE
    "glm4_moe-two-shared": (1, 2),  # dense, MoE
}
#: Configs that differ from a hybrid family's only in its mixer (Falcon-H1 without the Mamba RMSNorm).
_MIXER_VARIANTS = {"falcon_h1-no-mamba-norm"}
#: The layers checked in the hybrid families: one of each (mixer, FFN) kind, each after an earlier
#: layer of its mixer kind where masks are shared (hf_saved leaves out what another layer kept).
HYBRID_LAYERS = {
    "qwen3_next": (2, 3, 4),  # linear attention + dense, attention + MoE, linear attention + MoE
    "jamba": (1, 2, 3),  # Mamba 1 + dense, Mamba 1 + MoE, attention + dense
    "falcon_h1": (1,),  # attention and Mamba 2 in parallel + dense
    "falcon_h1-no-mamba-norm": (1,),
    "nemotron_h": (2, 3, 4, 5),  # Mamba 2, MLP, MoE, attention blocks
    "granitemoehybrid": (2, 3),  # Mamba 2 + MoE and shared MLP, attention + MoE
}


def _hybrid_case(family: str, precision: str, attention: str, layer: int) -> tuple[bool, bool]:
    """(run, slow) of a hybrid family's case. The scans are slow on CPU, so each mechanism is checked
    once: every layer in bf16 with SDPA (the fast suite), every layer in fp32 with SDPA (the up-casts
    that are no-ops in fp32), and eager attention in bf16 on the layers that attend (a Mamba or
    DeltaNet mixer does not depend on the attention kernel); fp32 with eager attention adds nothing
    the dense families' fp32 eager cases do not check. A variant of a family's mixer (``_MIXER_VARIANTS``)
    has the family's attention: its eager case is the family's."""
    if (precision, attention) == ("bf16", "sdpa"):
        return True, False
    if attention == "sdpa":
        return True, True
    attends = model_from_config(_CONFIGS[family]).layers[layer].attends
    return precision == "bf16" and attends and family not in _MIXER_VARIANTS, True


def _cases() -> list[object]:
    cases = []
    for family in _CONFIGS:
        if family in _SKIP:
            continue
        for precision in ("bf16", "fp32"):
            for attention in ("sdpa", "eager"):
                if attention == "sdpa" and family in _EAGER_ONLY:
                    continue
                for layer in HYBRID_LAYERS.get(family) or _LAYERS.get(family, (1,)):
                    run, slow = (
                        _hybrid_case(family, precision, attention, layer) if family in HYBRID_LAYERS else (True, False)
                    )
                    if run:
                        cases.append(
                            pytest.param(family, precision, attention, layer, marks=(pytest.mark.slow,) * slow)
                        )
    return cases


def estimated_per_token(
    config: dict, *, precision: str, attention: str, layer: int = 1, training_cache: bool = False
) -> float:
    """vramlens' bytes per token for decoder layer ``layer`` (full fine-tuning, no TP): what autograd
    saves, and with ``training_cache`` what the training forward's KV cache keeps beside it."""
    spec = model_from_config(config, name="tiny")
    workload = load_workload(
        {"model": "llama-3.1-8b", "precision": precision, "batch": 2, "seq": _SEQ, "attention": attention}
    )
    ctx = resolve_training(spec, workload)
    recipe = layer_recipe(ctx, train_state(ctx, lora_targets(ctx)), [])
    kind = layer_kind(spec.layers[layer], _SEQ)
    cache = training_cache_parts(recipe, kind) if training_cache else []
    return sum(part.bytes_per_token for part in layer_saved_parts(recipe, kind) + cache)


def _tolerance(family: str, precision: str, layer: int = 1) -> float:
    if family in _MOE or (family in HYBRID_CONFIGS and model_from_config(_CONFIGS[family]).layers[layer].moe):
        return 0.02
    layer_norm = family.startswith(("phi", "gpt", "falcon", "starcoder"))
    return 0.015 if (layer_norm and precision == "bf16") else 0.0


@pytest.mark.parametrize(("family", "precision", "attention", "layer"), _cases())
def test_layer_recipe_matches_autograd(family: str, precision: str, attention: str, layer: int) -> None:
    from hf_saved import layer_saved_bytes_per_token

    dtype = {"bf16": "bfloat16", "fp32": "float32"}[precision]
    config = _CONFIGS[family]
    truth = layer_saved_bytes_per_token(config, dtype=dtype, attention=attention, seq=_SEQ, layer=layer)
    ours = estimated_per_token(config, precision=precision, attention=attention, layer=layer)
    assert ours == pytest.approx(truth, rel=_tolerance(family, precision, layer), abs=0.5)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama4_text", "llama4"])
@pytest.mark.parametrize("layer", [0, 1, 2, 3])
@pytest.mark.parametrize(("precision", "attention"), [("bf16", "sdpa"), ("bf16", "eager"), ("fp32", "sdpa")])
def test_llama4_layer_kinds_match_autograd(family: str, layer: int, precision: str, attention: str) -> None:
    """Every Llama 4 layer kind, exactly: dense and MoE (all experts on every token, sigmoid
    router, shared expert), rotary layers with chunked attention (masked: the chunk of 16 is
    shorter than the 64 tokens) and the q/k L2 norm, the NoPE layer with full attention and
    temperature-tuned queries; the multimodal wrapper runs the same text layers."""
    from hf_saved import layer_saved_bytes_per_token

    dtype = {"bf16": "bfloat16", "fp32": "float32"}[precision]
    config = _CONFIGS[family]
    truth = layer_saved_bytes_per_token(config, dtype=dtype, attention=attention, seq=_SEQ, layer=layer)
    ours = estimated_per_token(config, precision=precision, attention=attention, layer=layer)
    assert ours == truth


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_llama_recipe_matches_autograd(attention: str) -> None:
    """The most used family, kept in the fast suite."""
    from hf_saved import layer_saved_bytes_per_token

    truth = layer_saved_bytes_per_token(FAMILY_CONFIGS["llama"], dtype="bfloat16", attention=attention, seq=_SEQ)
    assert estimated_per_token(FAMILY_CONFIGS["llama"], precision="bf16", attention=attention) == truth


def test_dropout_masks_are_one_byte_per_element_on_cuda() -> None:
    """GPT-2's default dropouts (0.1) keep a mask over the heads x s attention probabilities plus
    the dropped-out probabilities, and a mask per residual branch (2 x hidden). On CPU a mask
    element takes the tensor's 4 bytes, on CUDA 1: the CPU difference is vramlens' difference
    plus 3 bytes per mask element."""
    from hf_saved import layer_saved_bytes_per_token

    config = FAMILY_CONFIGS["gpt2"]
    cpu = {
        dropout: layer_saved_bytes_per_token(cfg, dtype="float32", attention="eager", seq=_SEQ)
        for dropout, cfg in ((True, config), (False, _NO_DROPOUT_GPT2))
    }
    ours = {
        dropout: estimated_per_token(cfg, precision="fp32", attention="eager")
        for dropout, cfg in ((True, config), (False, _NO_DROPOUT_GPT2))
    }
    mask_elements = config["n_head"] * _SEQ + 2 * config["n_embd"]
    assert ours[True] - ours[False] == (1 + 4) * config["n_head"] * _SEQ + 2 * config["n_embd"]
    assert cpu[True] - cpu[False] == ours[True] - ours[False] + 3 * mask_elements


@pytest.mark.parametrize("family", ["llama", "gemma", "qwen3", "smollm3-nope-sliding", "cohere2"])
def test_autocast_recipe_matches_autograd(family: str) -> None:
    """Mixed precision (fp32 weights under bf16 autocast): the residual stream is fp32 and every
    RMSNorm returns fp32 (Gemma's ``output.type_as(x)`` too), so each projection after a norm
    keeps its own bf16 cast of the input."""
    from hf_saved import layer_saved_bytes_per_token

    config = FAMILY_CONFIGS[family]
    truth = layer_saved_bytes_per_token(config, dtype="float32", attention="sdpa", seq=_SEQ, autocast=True)
    assert estimated_per_token(config, precision="mixed-bf16", attention="sdpa") == pytest.approx(truth, abs=0.5)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "olmoe", "glm4_moe", "gpt_oss"])
def test_autocast_moe_recipe_matches_autograd(family: str) -> None:
    """Mixed precision on an MoE layer: transformers' experts multiply with ``grouped_mm`` in
    their fp32 weights' dtype (not autocast's bf16), and each linear reading the block's fp32
    input (router, shared expert) keeps its own bf16 cast. Before this was modelled the
    estimate was 18-37% under autograd's count."""
    from hf_saved import layer_saved_bytes_per_token

    config = _CONFIGS[family]
    attention = "eager" if family in _EAGER_ONLY else "sdpa"
    truth = layer_saved_bytes_per_token(config, dtype="float32", attention=attention, seq=_SEQ, autocast=True)
    ours = estimated_per_token(config, precision="mixed-bf16", attention=attention)
    assert ours == pytest.approx(truth, rel=0.01)


#: One mixer layer per scan: gated DeltaNet, Mamba 1, Mamba 2 beside attention (Falcon-H1) and alone (Nemotron-H).
_MIXER_LAYERS = {"qwen3_next": 2, "jamba": 1, "falcon_h1": 1, "nemotron_h": 2}


def _frozen_per_token(config: dict, *, seq: int, layer: int) -> float:
    """vramlens' bytes per token of ``layer`` with every weight frozen (LoRA's layers, no adapters)."""
    import dataclasses

    spec = model_from_config(config, name="tiny")
    workload = load_workload({"model": "llama-3.1-8b", "precision": "bf16", "batch": 2, "seq": seq})
    ctx = resolve_training(spec, workload)
    recipe = dataclasses.replace(
        layer_recipe(ctx, train_state(ctx, lora_targets(ctx)), []),
        train=TrainState(norms=False, needs_input=frozenset(), adapters=frozenset()),
    )
    kind = LayerKind(mixer=spec.layers[layer].mixer, ffn=spec.layers[layer].ffn)
    return sum(part.bytes_per_token for part in layer_saved_parts(recipe, kind))


@pytest.mark.slow
@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen"])
@pytest.mark.parametrize("family", sorted(_MIXER_LAYERS))
def test_mixers_at_a_padded_multi_chunk_length(family: str, frozen: bool) -> None:
    """100 tokens: two gated-DeltaNet chunks of 64 with 28 padded positions, seven Mamba 2 chunks of
    16 with 12; the sequential Mamba 1 scan keeps one state per token. Frozen: multiplications
    keep an operand only for the other operand's gradient, so frozen mixers keep less."""
    from hf_saved import layer_saved_bytes_per_token

    config, layer = _CONFIGS[family], _MIXER_LAYERS[family]
    truth = layer_saved_bytes_per_token(config, seq=100, layer=layer, frozen=frozen)
    if frozen:
        ours = _frozen_per_token(config, seq=100, layer=layer)
    else:
        spec = model_from_config(config, name="tiny")
        workload = load_workload({"model": "llama-3.1-8b", "precision": "bf16", "batch": 2, "seq": 100})
        ctx = resolve_training(spec, workload)
        recipe = layer_recipe(ctx, train_state(ctx, lora_targets(ctx)), [])
        kind = LayerKind(mixer=spec.layers[layer].mixer, ffn=spec.layers[layer].ffn)
        ours = sum(part.bytes_per_token for part in layer_saved_parts(recipe, kind))
    assert ours == pytest.approx(truth, abs=0.5)
