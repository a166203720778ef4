"""ZeRO-3's gathered parameters (vramlens.estimator.zero3), worked by hand on the tiny Llama of the
DeepSpeed fidelity test (tests/estimator/test_deepspeed.py runs DeepSpeed itself on it): hidden 256,
4 layers of q/o 65,536, k/v 16,384 and gate/up/down 176,128 elements, norms of 256 (persistent under
HF's auto threshold 10 x 256), embedding and head 512,000 each."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import requires_hf
from vramlens.estimator.zero3 import (
    Zero3Model,
    gathered_elements,
    inflight_gradients,
    reuse_kept,
    step_sub_group,
)
from vramlens.resolve.zero import ZeroSettings

_LAYER = (256, 256, 65_536, 16_384, 16_384, 65_536, 176_128, 176_128, 176_128)
_MODEL = Zero3Model(
    layer=_LAYER, layers=4, embedding=512_000, head=512_000, tied=False, final_norm=256, persistence_threshold=2_560
)
_P, _T = sum(_LAYER), 256 + 512_000  # a layer's elements; final norm + head
_PERSISTENT = 9 * 256
_ALL = 4 * _P + 2 * 512_000 + 256  # every element of the model


def _settings(max_live: int, max_reuse: int, prefetch: int = 58_982) -> ZeroSettings:
    return ZeroSettings(
        reduce_bucket=65_536, prefetch_bucket=prefetch, max_live=max_live, max_reuse=max_reuse,
        persistence_threshold=2_560, sub_group=10**9, note="",
    )  # fmt: skip


def test_the_model_counts_every_element() -> None:
    assert _MODEL.persistent + _MODEL.total == _ALL == 3_795_200
    assert _MODEL.largest == 176_128


@pytest.mark.parametrize(
    ("max_reuse", "kept", "first"),
    [
        (0, 0, 0),  # nothing is kept, not even the head (the check comes before any module)
        (1, 512_000, 0),  # the head is used again at once
        # down_proj of the last layer: 2 x (0 + T) = 1,024,512 < R; up_proj: 2 x (176,128 + T) is not
        (1_100_000, 512_000 + 176_128, 0),
        # everything: each tensor of every layer and the embedding (2 x (4 P + T) = 6,566,400 < R)
        (10**9, _ALL - _PERSISTENT, _P - 512 + 512_000),
    ],
)
def test_reuse_kept_is_the_distance_rule_by_hand(max_reuse: int, kept: int, first: int) -> None:
    found = reuse_kept(_MODEL, max_reuse)
    assert (found.total, found.first_layer + found.embedding) == (kept, first)


def test_a_layer_further_back_needs_two_layers_more_distance() -> None:
    """down_proj of the layer before the last: 2 x (P + T) = 2,410,496 elements to its next use."""
    just_under, just_over = reuse_kept(_MODEL, 2 * (_P + _T)), reuse_kept(_MODEL, 2 * (_P + _T) + 1)
    assert just_over.total - just_under.total == 176_128


def test_gathered_at_each_instant() -> None:
    nothing = gathered_elements(_MODEL, _settings(0, 0))
    assert nothing.loss == _PERSISTENT  # tracked: only the norms at the start of backward
    assert nothing.forward_layer == nothing.first_layers == nothing.last_layer == _PERSISTENT + 176_128
    assert nothing.end == _PERSISTENT + 512_000
    everything = gathered_elements(_MODEL, _settings(10**9, 10**9))
    assert everything.loss == everything.forward_layer == _ALL  # tracked: the whole model
    assert everything.first_layers == _ALL - 512_000  # the head released after its backward
    assert everything.last_layer == _PERSISTENT + _P - 512 + 512_000  # the first layer and the embedding left
    small = gathered_elements(_MODEL, _settings(2_000_000, 1_100_000))
    assert small.loss == _PERSISTENT + 2_000_000 + 176_128  # the live bound and one tensor over it
    no_prefetch = gathered_elements(_MODEL, _settings(2_000_000, 1_100_000, prefetch=0))
    assert no_prefetch.loss == _PERSISTENT + 512_000 + 176_128  # the kept ones only


def test_the_gradients_in_flight() -> None:
    # gate/up/down exceed the 65,536-element bucket: one waits beside the next; the head's after its backward
    assert inflight_gradients(_MODEL, 176_128, edges_trained=True, bucket=65_536) == (
        2 * 176_128,
        512_000 + 176_128,
        512_000 + 176_128,
    )
    # a bucket they fit: only the gradient being made (copied into the bucket by its hook)
    assert inflight_gradients(_MODEL, 176_128, edges_trained=False, bucket=10**6) == (176_128, 176_128, 0)


def test_a_tied_table_is_the_head_used_again_last() -> None:
    tied = replace(_MODEL, embedding=0, tied=True)
    everything = gathered_elements(tied, _settings(10**9, 10**9))
    assert everything.first_layers == everything.loss  # the table stays: the embedding's backward uses it
    assert everything.end == _PERSISTENT + 512_000


def test_the_optimizer_steps_one_sub_group_at_a_time() -> None:
    assert step_sub_group(1_897_600, 88_064, 10**9) == 1_897_600  # the tiny model: one sub group
    # 70B over 8 ranks: 8.7e9 elements a rank, sub groups of 1e9 and one tensor's partition more
    assert step_sub_group(8_700_000_000, 29_360_128, 10**9) == 1_029_360_128


def test_a_checkpointed_layer_is_used_again_in_its_recomputed_forward() -> None:
    """Every layer checkpointed: the last layer's down_proj is fetched first in its backward (after
    2 T = 1,024,512 elements), the others in the recomputed forward (after 2 T + P + down - e_j); a layer
    further back 3 P later. Tracked CPU runs of DeepSpeed (deepspeed_run.py with checkpointing, no
    prefetch): reuse distance 1.1e6 keeps 688,128 elements, 3e6 keeps 1,204,224."""
    recomputed = replace(_MODEL, recomputed=True)
    layer = _P - 512
    assert reuse_kept(recomputed, 1_100_000).total == 512_000 + 176_128
    assert reuse_kept(recomputed, 3_000_000).total == 512_000 + layer
    # not checkpointed, 3e6 would keep two layers' down_proj and up_proj and one layer's other tensors
    assert reuse_kept(_MODEL, 3_000_000).total == 512_000 + 4 * 176_128 + (layer - 2 * 176_128)
    assert reuse_kept(recomputed, 3 * _P + 2 * _T + 1).total == 512_000 + layer + 176_128  # down_proj one layer back
    assert gathered_elements(recomputed, _settings(0, 3_000_000)).first_layers == _PERSISTENT + layer


@requires_hf
@pytest.mark.hf
@pytest.mark.slow  # traces the model (seconds)
def test_a_model_traced_from_its_code_is_gathered_whole_under_the_live_bound() -> None:
    """No native family (Qwen3.5 MoE: gated delta-net and attention layers of different sizes): the
    layer's tensors come from the layout read off its module tree, each layer's elements from its own
    kind; a small model is gathered whole (fewer than 1e9 elements), in bf16."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
    from generic_configs import small_config

    from vramlens.estimator import estimate
    from vramlens.model.families import parse_config

    spec = parse_config(small_config("qwen3_5_moe_text"), source="qwen3_5_moe_text")
    report = estimate({"model": spec, "parallel": {"gpus": 2, "shard": "zero3"}, "batch": 1, "seq": 64})
    gathered = next(t.bytes for t in report.terms if t.name.startswith("ZeRO-3 gathered parameters"))
    assert spec.generic is not None and gathered == 2 * spec.num_parameters
