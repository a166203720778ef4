"""The hybrid families end to end in the estimator: PEFT's refusals, the Mamba 1 backward working
set, Nemotron-H's float32 logits, the kernel assumption, and every layer kind counted once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from vramlens.errors import InputError
from vramlens.estimator import estimate_resolved
from vramlens.model.families import parse_config
from vramlens.workload.load import load_workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))

from family_configs import HYBRID_CONFIGS


def _estimate(family: str, **workload: Any) -> Any:
    spec = parse_config({**HYBRID_CONFIGS[family], "max_position_embeddings": 4096})
    return estimate_resolved(spec, load_workload({"model": "llama-3.1-8b", "batch": 2, "seq": 256, **workload}), None)


@pytest.mark.parametrize("family", ["nemotron_h", "falcon_h1"])
def test_peft_refuses_lora_on_the_mamba_out_proj(family: str) -> None:
    # PEFT 0.21 _check_lora_target_modules_mamba raises for out_proj / conv1d of these model types,
    # and all-linear includes out_proj.
    for targets in ("all-linear", ["in_proj", "out_proj"]):
        with pytest.raises(InputError, match=r"^lora\.targets: PEFT refuses LoRA on out_proj of") as info:
            _estimate(family, method="lora", lora={"targets": targets})
        assert "\n" not in str(info.value) and "in_proj" in str(info.value)
    assert _estimate(family, method="lora", lora={"targets": ["in_proj", "q_proj"]}).allocated_bytes > 0


def test_other_hybrids_take_lora_on_every_linear() -> None:
    # Jamba, Granite 4.0-H and Qwen3-Next are not in PEFT's list: out_proj is a valid target there.
    for family in ("jamba", "granitemoehybrid", "qwen3_next"):
        assert _estimate(family, method="lora").allocated_bytes > 0


def test_the_mamba1_backward_working_set_is_four_fp32_state_tensors_per_token() -> None:
    from vramlens.estimator.mixers import mixer_backward_working
    from vramlens.model.components import MixerKind

    spec = parse_config(HYBRID_CONFIGS["jamba"])
    m = spec.mamba
    assert m is not None
    per_token = mixer_backward_working(spec, {MixerKind.MAMBA, MixerKind.ATTENTION}, seq=256, compute_bytes=2)
    assert per_token == 4 * 4 * m.intermediate_size * m.state_size == 4 * 4 * 128 * 8
    assert mixer_backward_working(spec, {MixerKind.ATTENTION}, seq=256, compute_bytes=2) == 0


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_mamba1_scan_backward_sits_beside_the_layer_mamba_half_only(recompute: str) -> None:
    """Backward frees a Jamba layer's MLP or MoE half, its gate and out_proj input before the scan's
    gradient buffers exist: the recomputed layer and the working set at that instant are the Mamba
    half up to the scan plus four fp32 d_inner x N tensors per token, not the largest layer whole."""
    from vramlens.estimator.activations import ffn_saved_parts, layer_saved_parts
    from vramlens.estimator.mixers import mixer_after_scan_parts, mixer_backward_working
    from vramlens.estimator.recompute import layer_activations, layer_kind, layer_recipe, train_state
    from vramlens.model.components import MixerKind
    from vramlens.resolve.context import resolve_training

    spec = parse_config({**HYBRID_CONFIGS["jamba"], "max_position_embeddings": 4096})
    workload = load_workload(
        {"model": "llama-3.1-8b", "batch": 2, "seq": 128, "precision": "mixed-bf16", "recompute": recompute}
    )
    ctx = resolve_training(spec, workload)
    state = train_state(ctx, frozenset())
    acts = layer_activations(ctx, state, range(len(spec.layers)))
    recipe = layer_recipe(ctx, state, [])
    working = mixer_backward_working(spec, {MixerKind.MAMBA}, seq=128, compute_bytes=2)
    kinds = {layer_kind(layer, 128) for layer in spec.layers if layer.mixer is MixerKind.MAMBA}
    mamba_half = {
        kind: sum(p.bytes_per_token for p in layer_saved_parts(recipe, kind))
        - sum(p.bytes_per_token for p in ffn_saved_parts(recipe, kind) + mixer_after_scan_parts(recipe, kind.mixer))
        for kind in kinds
    }
    assert len(kinds) == 2 and len(set(mamba_half.values())) == 1  # a Mamba + MLP and a Mamba + MoE kind
    if recompute == "full":
        at_scan = acts.transient_per_token + acts.mixer_backward_per_token
        assert at_scan == pytest.approx(max(mamba_half.values()) + working)
        assert at_scan < acts.transient_per_token + working  # the MoE half is gone by then
    else:  # the smallest feed-forward half (the MLP's) is the least freed before a scan's backward
        smallest = min(
            sum(p.bytes_per_token for p in ffn_saved_parts(recipe, kind) + mixer_after_scan_parts(recipe, kind.mixer))
            for kind in kinds
        )
        assert acts.mixer_backward_per_token == pytest.approx(working - smallest)


def test_nemotron_h_logits_are_float32() -> None:
    # NemotronHForCausalLM returns lm_head(hidden).float(): the loss and the kept outputs hold fp32
    # logits (vocab 128 here: 2 bytes more per logit kept than a bf16 model's).
    report = _estimate("nemotron_h")
    logits = next(term for term in report.terms if term.name.startswith("logits and loss"))
    assert "(4+0+4)V" in logits.formula


def test_the_report_says_which_mamba_implementation_it_models() -> None:
    from vramlens.estimator.mixers import KERNEL_ASSUMPTION

    for family in HYBRID_CONFIGS:
        assert KERNEL_ASSUMPTION in _estimate(family).assumptions


def test_the_time_model_counts_scans_not_attention_for_state_layers() -> None:
    from vramlens.estimator.time_flops import attention_core_flops, scan_flops

    spec = parse_config(HYBRID_CONFIGS["nemotron_h"])  # M * M - E *: two attention, two Mamba 2 blocks
    m = spec.mamba
    assert m is not None
    scans = 2 * 6.0 * m.intermediate_size * m.state_size
    attention_only = attention_core_flops(spec, 0)
    assert attention_only == scans  # no keys attended at seq 0, only the scans
    width = spec.attention.num_heads * 2 * spec.attention.head_dim
    assert attention_core_flops(spec, 1000) == scans + 2 * (2.0 * width * 500)
    assert scan_flops(spec, spec.layers[1].mixer) == 0.0  # an attention block
