"""Reserved from the allocator model (``vramlens.estimator.reserved``) and the ``alloc_conf`` key.

What is checked, and where the expected numbers come from:

* with FSDP2, and on one GPU unless ``reserved_replay: false`` (the default is the replay), the
  slack is the replay of the whole step pattern, every layer;
* otherwise (DDP, or one GPU with ``reserved_replay: false``) the vocabulary part is the replay of the step pattern without decoder
  layers (``step_pattern(layers=0)``) through ``vramlens.allocator``, less the layers' gradients
  (which are allocated during backward and can take the stranded blocks), and the layers' part is
  ``LAYER_SLACK_FRACTION`` x each kind of churn (``layer_churn``), the fitted table of
  ``benchmarks/allocator_fit.py``; the margin is ``LAYER_SLACK_SPREAD`` x the churn in every case;
* the step pattern writes each layer's saved tensors from the recipe's parts (by hand below);
* expandable segments, which map pages into one growing range instead of stranding freed
  segments, never raise the slack; ``alloc_conf`` errors are one line naming the key;
* by hand: a 100 MiB tensor freed before a 120 MiB request strands its segment.
"""

from __future__ import annotations

import pytest

from vramlens.allocator import AllocatorSettings
from vramlens.allocator.pattern import Pattern, pattern_peaks
from vramlens.allocator.streams import Stream
from vramlens.errors import InputError
from vramlens.estimator import estimate
from vramlens.estimator.layout import param_layout
from vramlens.estimator.loss_pattern import LossScript
from vramlens.estimator.quantities import stage_memory
from vramlens.estimator.reserved import (
    KV_GROWTH_FRACTION,
    LAYER_SLACK_FRACTION,
    LAYER_SLACK_SPREAD,
    allocator_settings,
    generation_slack,
    layer_churn,
    replayed_slack,
    replays_whole_step,
    training_loss_script,
    training_slack,
)
from vramlens.estimator.step_pattern import step_pattern
from vramlens.estimator.step_shape import step_shape
from vramlens.model.resolve import load_model
from vramlens.resolve.context import resolve_training
from vramlens.workload.load import load_workload

MiB = 1 << 20
WORKLOADS = {
    "full bf16": {"model": "qwen2.5-0.5b", "precision": "bf16", "batch": 1, "seq": 1024, "reserved_replay": False},
    "full bf16 whole step": {"model": "qwen2.5-0.5b", "precision": "bf16", "batch": 1, "seq": 1024},
    "lora mixed": {"model": "llama-3.2-1b", "method": "lora", "batch": 2, "seq": 2048, "reserved_replay": False},
    "full fsdp": {"model": "llama-3.2-1b", "batch": 2, "seq": 2048, "parallel": {"gpus": 8, "shard": "fsdp"}},
    "full ddp": {
        "model": "qwen2.5-0.5b",
        "precision": "bf16",
        "batch": 1,
        "seq": 1024,
        "parallel": {"gpus": 2, "shard": "ddp"},
    },
}


def _parts(workload: dict[str, object]) -> tuple:
    resolved = load_workload(workload)
    spec = load_model(resolved.model)
    ctx = resolve_training(spec, resolved)
    layout = param_layout(ctx)
    mem = stage_memory(ctx, layout.stages[0], layout.targets)
    return ctx, mem, layout.targets


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_slack_is_the_replayed_vocabulary_part_plus_the_fitted_layer_part(name: str) -> None:
    ctx, mem, targets = _parts(WORKLOADS[name])
    settings = AllocatorSettings()
    slack = training_slack(ctx, mem, targets, settings)
    shape = step_shape(ctx, mem, targets, layers=False)
    if shape.gather_copy_out or replays_whole_step(ctx):  # FSDP2 or one GPU: the whole step replayed, every layer
        whole = step_shape(ctx, mem, targets)
        replayed = replayed_slack(whole, training_loss_script(ctx, mem), layers=whole.layers, micro_steps=1,
                                  settings=settings)  # fmt: skip
        assert slack.replayed and slack.vocabulary_bytes == 0 and slack.layers_bytes == max(0, replayed)
        assert estimate(WORKLOADS[name]).reserved_bytes == estimate(WORKLOADS[name]).allocated_bytes + replayed
        return
    replayed = replayed_slack(shape, training_loss_script(ctx, mem), layers=0, micro_steps=1, settings=settings)
    # the decoder layers' gradients (full: weights; LoRA: adapters) reuse stranded vocabulary blocks
    trained = sum(group.elements for group in mem.stage.trainable) - sum(shape.edge_trained)
    gradients = trained * shape.grad_bytes // shape.grads_sharded
    assert slack.vocabulary_bytes == max(0, replayed - gradients)
    sharded = ctx.workload.parallel.shard.value == "fsdp"
    churn = layer_churn(mem)
    fractions = LAYER_SLACK_FRACTION[(False, sharded)]
    assert slack.layers_bytes == int(sum(f * c for f, c in zip(fractions, churn, strict=True)))
    assert slack.spread_bytes == int(LAYER_SLACK_SPREAD[(False, sharded)] * sum(churn))
    report = estimate(WORKLOADS[name])
    assert report.reserved_bytes == report.allocated_bytes + slack.total_bytes


def test_one_gpu_replays_the_whole_step_unless_the_workload_says_false() -> None:
    closed, whole = (_parts(WORKLOADS[name])[0] for name in ("full bf16", "full bf16 whole step"))
    assert not replays_whole_step(closed) and replays_whole_step(whole)
    ddp = _parts({**WORKLOADS["full ddp"], "reserved_replay": True})[0]
    assert not replays_whole_step(ddp)  # several GPUs without FSDP2: the closed form whatever the key says
    notes = [" ".join(estimate(WORKLOADS[name]).assumptions) for name in ("full bf16", "full bf16 whole step")]
    assert "fitted fractions" in notes[0] and "the whole step replayed" in notes[1]


def test_a_replay_asked_for_after_closed_forms_of_the_same_stage_is_a_replay() -> None:
    """The closed form keeps a template per stage once its size-free settings are seen twice; a
    workload of that stage that asks for the whole-step replay must still get the replay (it
    got the template's closed form before ``training_slack`` asked ``replays_whole_step`` first)."""
    base = {"model": "qwen2.5-0.5b", "precision": "bf16", "batch": 3, "seq": 1000, "reserved_replay": False}
    replayed = estimate({**base, "reserved_replay": True})
    closed = estimate(base)
    assert replayed.reserved_bytes != closed.reserved_bytes  # the two differ on this workload
    for seq in (1100, 1200, 1300):  # the stage's template is made
        estimate({**base, "seq": seq})
    assert estimate({**base, "reserved_replay": True}).reserved_bytes == replayed.reserved_bytes
    assert "the whole step replayed" in " ".join(estimate({**base, "seq": 1400, "reserved_replay": True}).assumptions)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_expandable_segments_never_raise_the_slack(name: str) -> None:
    plain = estimate(WORKLOADS[name])
    expandable = estimate({**WORKLOADS[name], "alloc_conf": "expandable_segments:True"})
    assert expandable.allocated_bytes == plain.allocated_bytes
    assert plain.allocated_bytes <= expandable.reserved_bytes <= plain.reserved_bytes
    assert "expandable_segments:True" in " ".join(expandable.assumptions)


def test_the_fitted_tables_cover_every_key_with_non_negative_fractions() -> None:
    keys = {(expandable, sharded) for expandable in (False, True) for sharded in (False, True)}
    assert set(LAYER_SLACK_FRACTION) == set(LAYER_SLACK_SPREAD) == keys
    assert all(f >= 0 for fractions in LAYER_SLACK_FRACTION.values() for f in fractions)
    for sharded in (False, True):  # expandable segments strand less at every kind of churn
        plain, expandable = LAYER_SLACK_FRACTION[(False, sharded)], LAYER_SLACK_FRACTION[(True, sharded)]
        assert all(e <= p for e, p in zip(expandable, plain, strict=True))
    assert KV_GROWTH_FRACTION[True] < KV_GROWTH_FRACTION[False]


def test_generation_slack_is_the_fitted_fraction_of_the_cache() -> None:
    assert generation_slack(1000 * MiB, AllocatorSettings()) == int(KV_GROWTH_FRACTION[False] * 1000 * MiB)
    report = estimate({"model": "llama-3.2-1b", "mode": "infer", "batch": 2, "prompt": 2048, "generate": 512})
    kv = report.peak.breakdown.get(next(c for c in report.peak.breakdown if c.value == "kv_cache"), 0)
    assert report.reserved_bytes - report.allocated_bytes == int(KV_GROWTH_FRACTION[False] * kv)


def test_a_freed_block_too_small_for_the_next_request_by_hand() -> None:
    # A step whose loss frees a 100 MiB tensor and then asks for 120 MiB: the 100 MiB segment is
    # cached and cannot serve it, so it is slack: 100 MiB (segments of >= 10 MiB requests are
    # their size rounded to 2 MiB; nothing else is alive).
    ctx, mem, targets = _parts(WORKLOADS["full bf16"])
    shape = step_shape(ctx, mem, targets)
    empty = shape.__class__(**{**{f: getattr(shape, f) for f in shape.__slots__}, "edge_params": (), "edge_trained": (),
                               "embedding_trained": False, "head_trained": False, "tied_grads": False, "extra_trained": (), "head_cast": 0, "non_layer": 0,
                               "inputs": 0, "hidden": 0})  # fmt: skip
    loss = LossScript(forward=(("+", "a", 100 * MiB), ("-", "a", 0), ("+", "b", 120 * MiB)), backward=(("-", "b", 0),))
    peaks = pattern_peaks(step_pattern(empty, loss, layers=0))
    # the cuBLAS workspace (32 MiB) is allocated first and stays; the autograd thread's (32 MiB) comes
    # with the backward's first matmul, while "b" is alive, and takes 32 MiB of the cached segment
    assert peaks.allocated_bytes == (32 + 120 + 32) * MiB
    assert peaks.slack_bytes == (100 - 32) * MiB


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("max_split_size_mb:4", "alloc_conf: "),
        ("expandable_segments:maybe", "alloc_conf: "),
        ("no_such_key:1", "alloc_conf: "),
        (7, "alloc_conf: must be a PYTORCH_CUDA_ALLOC_CONF string"),
    ],
)
def test_alloc_conf_errors_are_one_line_naming_the_key(value: object, message: str) -> None:
    with pytest.raises(InputError) as error:
        load_workload({"model": "gpt2", "alloc_conf": value})
    text = str(error.value)
    assert text.startswith(message) and "\n" not in text


def test_alloc_conf_is_kept_as_written_and_parsed_once() -> None:
    workload = load_workload({"model": "gpt2", "alloc_conf": " expandable_segments:True,max_split_size_mb:512 "})
    assert workload.alloc_conf == "expandable_segments:True,max_split_size_mb:512"
    settings = allocator_settings(workload.alloc_conf)
    assert settings.expandable_segments and settings.max_split_size_bytes == 512 * MiB
    assert allocator_settings(workload.alloc_conf) is settings
    assert load_workload({"model": "gpt2"}).alloc_conf == ""


def test_the_sharded_step_pattern_puts_fsdps_buffers_on_their_streams() -> None:
    ctx, mem, targets = _parts(WORKLOADS["full fsdp"])
    shape = step_shape(ctx, mem, targets)
    assert shape.gather_copy_out  # hf: accelerate's FSDP2
    pattern = step_pattern(shape, training_loss_script(ctx, mem, targets), layers=shape.layers)
    made = [(nbytes, stream) for nbytes, _, stream in pattern.events if nbytes > 0]
    gathered = {nbytes for nbytes, stream in made if stream == Stream.ALL_GATHER}
    reduced = {nbytes for nbytes, stream in made if stream == Stream.REDUCE_SCATTER}
    # the decoder units' all-gather outputs, and the tied tail's (V x h + the final norm's h, bf16)
    assert gathered == {shape.gather_layer, shape.gather_tail} and shape.tied
    assert shape.gather_tail == (128_256 * 2048 + 2048) * 2
    layer = sum(shape.layer_trained[0])
    # bf16 reduce (accelerate: reduce_dtype = param_dtype) then the fp32 sharded gradient
    assert layer * shape.reduce_bytes // shape.grads_sharded in reduced
    assert shape.grad_stream == Stream.REDUCE_SCATTER
    # the same requests on one stream hold less: the streams' pools are the slack's main part here
    one = Pattern()
    one.events = [(nbytes, key, Stream.DEFAULT) for nbytes, key, _ in pattern.events]
    assert pattern_peaks(pattern).slack_bytes > pattern_peaks(one).slack_bytes
