"""Mixer parameter counts written out by hand (transformers' modules, see model/ssm.py), and the
layer kinds the hybrid parsers produce."""

from __future__ import annotations

from family_configs import HYBRID_CONFIGS
from vramlens.model.families import parse_config
from vramlens.model.params import gated_deltanet_parameters, mamba_parameters
from vramlens.model.spec import FfnKind, MixerKind


def test_mamba1_by_hand() -> None:
    # Jamba tiny: h 64, d_inner 128, N 8, d_conv 4, dt_rank ceil(64/16) = 4, conv bias, no proj bias.
    spec = parse_config(HYBRID_CONFIGS["jamba"])
    assert spec.mamba is not None
    in_proj = 64 * 256
    conv = 128 * 4 + 128
    x_proj = 128 * (4 + 2 * 8)
    dt_proj = 4 * 128 + 128
    a_log, d = 128 * 8, 128
    out_proj = 128 * 64
    norms = 4 + 8 + 8  # Jamba's dt, B and C RMSNorms
    by_hand = in_proj + conv + x_proj + dt_proj + a_log + d + out_proj + norms
    assert by_hand == 29_588
    assert mamba_parameters(spec.mamba, 64) == by_hand


def test_mamba2_by_hand() -> None:
    # Nemotron-H tiny: 4 heads x 16 = d_inner 64, N 16, 2 groups, d_conv 4: in_proj to gate (64),
    # x, B, C (64 + 2 x 2 x 16 = 128) and dt (4); conv over 128 channels with bias; A_log, D and
    # dt_bias per head; the gated RMSNorm (64); out_proj.
    spec = parse_config(HYBRID_CONFIGS["nemotron_h"])
    assert spec.mamba is not None and spec.mamba.conv_dim == 128
    by_hand = 64 * (64 + 128 + 4) + (128 * 4 + 128) + 3 * 4 + 64 + 64 * 64
    assert by_hand == 17_356
    assert mamba_parameters(spec.mamba, 64) == by_hand


def test_gated_deltanet_by_hand() -> None:
    # Qwen3-Next tiny: 2 key heads x 16 (K 32), 4 value heads x 8 (V 32), d_conv 4.
    spec = parse_config(HYBRID_CONFIGS["qwen3_next"])
    assert spec.linear_attention is not None
    by_hand = 64 * (2 * 32 + 2 * 32) + 64 * (2 * 4) + (2 * 32 + 32) * 4 + 2 * 4 + 8 + 32 * 64
    assert gated_deltanet_parameters(spec.linear_attention, 64) == by_hand


def test_layer_kinds_of_each_hybrid() -> None:
    kinds = {
        key: [(layer.mixer, layer.ffn) for layer in parse_config(config).layers]
        for key, config in HYBRID_CONFIGS.items()
    }
    a, m, lin, both, none = (
        MixerKind.ATTENTION,
        MixerKind.MAMBA,
        MixerKind.LINEAR_ATTENTION,
        MixerKind.ATTENTION_AND_MAMBA,
        MixerKind.NONE,
    )
    dense, moe, no_ffn = FfnKind.DENSE, FfnKind.MOE, FfnKind.NONE
    assert kinds["nemotron_h"] == [(m, no_ffn), (a, no_ffn), (m, no_ffn), (none, dense), (none, moe), (a, no_ffn)]
    assert kinds["jamba"] == [(a, moe), (m, dense), (m, moe), (a, dense), (m, moe)]
    assert kinds["falcon_h1"] == [(both, dense)] * 2
    assert kinds["qwen3_next"] == [(lin, moe), (a, moe), (lin, dense), (a, moe), (lin, moe)]
    assert kinds["granitemoehybrid"] == [(m, moe), (a, moe)] * 2
