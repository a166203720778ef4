"""``MemoryTracker`` on real CPU tensors: hand-checked toy cases, categories, phases and module
attribution of a small training step, and the peak of a real transformers training step against
the CPU allocator's own ``[memory]`` events from ``torch.profiler``.

Byte counts are worked out from shapes and dtypes next to each assertion.
"""

from __future__ import annotations

import functools
import itertools
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from conftest import requires_hf  # noqa: E402
from vramlens.categories import Category  # noqa: E402
from vramlens.result.timeline import CATEGORY_ORDER, Timeline  # noqa: E402
from vramlens.trace.tracker import MemoryTracker, StorageTracker, track  # noqa: E402

PARAMS, GRADS, STATE = Category.PARAMETERS, Category.GRADIENTS, Category.OPTIMIZER_STATE
ACTS, TEMP, INPUTS = Category.ACTIVATIONS, Category.TEMPORARY, Category.INPUTS


def categories(timeline: Timeline) -> list[Category]:
    return [CATEGORY_ORDER[c] for c in timeline.category.tolist()]


def names(codes: Any, table: tuple[str, ...]) -> list[str]:
    return [table[c] if c >= 0 else "" for c in codes.tolist()]


# --- toy cases -----------------------------------------------------------------------------------


def test_views_in_place_ops_and_del() -> None:
    tracker = MemoryTracker(clock="event")
    with tracker:
        x = torch.ones(1000)  # 1000 float32 = 4000 B
        assert tracker.current == 4000
        view = x[10:]  # shares x's storage
        assert tracker.current == 4000
        y = torch.ones(1000)
        assert tracker.current == 8000
        x.add_(1)  # in place: no new storage
        y.mul_(3)
        assert tracker.current == 8000
        z = x * 2
        assert tracker.current == 12000
        del z
        assert tracker.current == 8000
        del x  # the view still holds the storage
        assert tracker.current == 8000
        del view
        assert tracker.current == 4000
    assert tracker.peak == 12000
    timeline = tracker.timeline()
    assert timeline.nbytes.tolist() == [4000, 4000, 4000, -4000, -4000]
    assert timeline.live_bytes.tolist() == [4000, 8000, 12000, 8000, 4000]
    assert timeline.time.tolist() == [0, 1, 2, 3, 4]
    assert timeline.storage.tolist() == [0, 1, 2, 2, 0]
    assert (timeline.peak_bytes, timeline.peak_index, timeline.end_bytes) == (12000, 2, 4000)
    assert y.sum().item() == 3000  # keeps y alive to the end


def test_dtype_sizes() -> None:
    tracker = MemoryTracker()
    with tracker:
        kept = [
            torch.zeros(10, dtype=torch.bfloat16),  # 20 B
            torch.arange(5),  # int64: 40 B
            torch.zeros(3, 7, dtype=torch.float64),  # 168 B
            torch.zeros(9, dtype=torch.bool),  # 9 B
        ]
    assert tracker.timeline().nbytes.tolist() == [20, 40, 168, 9]
    assert tracker.current == tracker.peak == 237
    assert len(kept) == 4


def test_time_is_nanoseconds_by_default() -> None:
    tracker = MemoryTracker()
    with tracker:
        a = torch.ones(4)
        del a
    timeline = tracker.timeline()
    assert timeline.time_unit == "ns"
    assert timeline.time[0] >= 0
    assert timeline.time[1] >= timeline.time[0]


def test_bad_clock_is_refused() -> None:
    with pytest.raises(ValueError, match="clock: 'ms'; accepted: ns, event"):
        MemoryTracker(clock="ms")


def test_storage_tracker_is_the_same_class() -> None:
    assert StorageTracker is MemoryTracker


def test_mark_and_reset_peak() -> None:
    tracker = MemoryTracker()
    with tracker:
        a = torch.ones(100)  # 400
        b = torch.ones(100)  # 800
        del b  # 400
        first = tracker.mark("one")
        tracker.reset_peak()
        c = torch.ones(50)  # 600
        second = tracker.mark("two")
    assert (first.name, first.live_bytes, first.peak_since_previous) == ("one", 400, 800)
    assert (second.name, second.live_bytes, second.peak_since_previous) == ("two", 600, 600)
    assert tracker.peak == 600
    assert [m.name for m in tracker.marks] == ["one", "two"]
    assert a.numel() + c.numel() == 150


# --- registration ---------------------------------------------------------------------------------


def test_registered_parameters_views_add_nothing() -> None:
    layer = nn.Linear(100, 50)  # weight 50 x 100 x 4 = 20000 B, bias 200 B
    tracker = MemoryTracker()
    tracker.register_model(layer)
    assert tracker.current == 20200
    with tracker:
        transposed = layer.weight.t()
        assert tracker.current == 20200
    assert tracker.peak == 20200
    assert categories(tracker.timeline()) == [PARAMS, PARAMS]
    assert transposed.shape == (100, 50)


def test_views_of_unregistered_tensors_are_not_new_memory_but_their_frees_are_unseen() -> None:
    """Views return their input's storage, so a view of a tensor made before tracking adds
    nothing; registering the tensor is what makes its later free (and its bytes) count."""
    layer = nn.Linear(100, 50)  # weight 100 x 50 fp32 = 20,000 B
    tracker = MemoryTracker()
    with tracker:
        transposed = layer.weight.t()
        doubled = transposed * 2  # a new 20,000 B storage
    assert tracker.timeline().nbytes.tolist() == [20000]
    assert transposed.shape == doubled.shape == (100, 50)
    registered = MemoryTracker()
    registered.register_model(layer)  # weight 20,000 B + bias 200 B
    with registered:
        layer.weight = None  # type: ignore[assignment]
        del transposed, doubled  # doubled's autograd graph holds the weight too
    assert registered.timeline().nbytes.tolist() == [20000, 200, -20000]


def test_register_default_categories() -> None:
    parameter = nn.Parameter(torch.zeros(8))  # 32 B
    ids = torch.zeros(2, 4, dtype=torch.int64)  # 64 B
    tracker = MemoryTracker()
    tracker.register([parameter, {"ids": ids}])
    tracker.register(torch.zeros(3), Category.KV_CACHE)  # 12 B, freed at once
    timeline = tracker.timeline()
    assert categories(timeline) == [PARAMS, INPUTS, Category.KV_CACHE, Category.KV_CACHE]
    assert timeline.nbytes.tolist() == [32, 64, 12, -12]
    assert names(timeline.phase, timeline.phases) == ["load"] * 4
    assert tracker.current == 96


def test_set_category_relabels_a_storage_for_its_whole_life() -> None:
    tracker = MemoryTracker()
    with tracker:
        cache = torch.zeros(16)
        tracker.set_category(cache[4:], "kv_cache")  # a view names the same storage
        del cache
    assert categories(tracker.timeline()) == [Category.KV_CACHE, Category.KV_CACHE]


# --- a small training step ---------------------------------------------------------------------------

# Linear(8, 16): 8*16 + 16 = 144 floats; Linear(16, 4): 16*4 + 4 = 68 floats -> 212 floats = 848 B.
PARAM_BYTES = 848
# AdamW keeps exp_avg and exp_avg_sq (2 x 848 B) and a float32 scalar `step` per parameter (4 x 4 B).
STATE_BYTES = 2 * 848 + 4 * 4
INPUT_BYTES = 32 * 8 * 4  # x: 32 x 8 float32


def small_model() -> tuple[nn.Module, Any, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optimizer, torch.randn(32, 8)


@functools.cache
def small_step() -> tuple[Timeline, dict[str, int]]:
    """One AdamW step of the small model under ``track``; event counts at the phase edges."""
    model, optimizer, x = small_model()
    ends: dict[str, int] = {}
    with track(model, optimizer, x) as tracker:
        ends["load"] = tracker.event_count
        out = model(x)
        loss = out.sum()
        ends["forward"] = tracker.event_count
        loss.backward()
        ends["backward"] = tracker.event_count
        optimizer.step()
        ends["optimizer_step"] = tracker.event_count
        optimizer.zero_grad(set_to_none=True)
        del out, loss
    return tracker.timeline(), ends


def test_training_step_breakdowns() -> None:
    timeline, ends = small_step()
    assert timeline.breakdown_at(ends["load"] - 1) == {PARAMS: PARAM_BYTES, INPUTS: INPUT_BYTES}
    # Forward: ReLU keeps its output (32 x 16 x 4 = 2048 B), the last Linear's output is kept
    # by `out` (32 x 4 x 4 = 512 B), the loss is one float (4 B); the first Linear's output is
    # freed once ReLU has run.
    forward = timeline.breakdown_at(ends["forward"] - 1)
    assert forward == {PARAMS: PARAM_BYTES, INPUTS: INPUT_BYTES, ACTS: 2048 + 512 + 4}
    after_backward = timeline.breakdown_at(ends["backward"] - 1)
    assert after_backward[GRADS] == PARAM_BYTES
    assert TEMP not in after_backward
    after_step = timeline.breakdown_at(ends["optimizer_step"] - 1)
    assert (after_step[PARAMS], after_step[GRADS], after_step[STATE]) == (PARAM_BYTES, PARAM_BYTES, STATE_BYTES)
    assert TEMP not in after_step
    # zero_grad(set_to_none=True) frees the gradients; `del` frees the forward's outputs.
    assert timeline.breakdown_at(len(timeline) - 1) == {PARAMS: PARAM_BYTES, STATE: STATE_BYTES, INPUTS: INPUT_BYTES}


def test_training_step_category_curves() -> None:
    timeline, ends = small_step()
    activations = timeline.category_curve(ACTS)
    # Both 32 x 16 outputs (Linear 0 and ReLU) are live together before the first is freed.
    assert int(activations[: ends["forward"]].max()) == 2048 + 2048
    assert int(timeline.category_curve(GRADS).max()) == PARAM_BYTES
    assert int(timeline.category_curve(STATE).max()) == STATE_BYTES
    temporary = timeline.category_curve(TEMP)
    backward = slice(ends["forward"], ends["backward"])
    optimizer_step = slice(ends["backward"], ends["optimizer_step"])
    assert temporary[backward].max() > 0
    assert temporary[optimizer_step].max() > 0
    assert int(temporary[-1]) == 0


def test_categories_are_per_storage() -> None:
    """A gradient's allocation and its free both carry `gradients`, so the curve returns to 0."""
    timeline, _ = small_step()
    cats = categories(timeline)
    gradient_storages = {s for s, c in zip(timeline.storage.tolist(), cats, strict=True) if c is GRADS}
    assert len(gradient_storages) == 4  # two weights, two biases
    events = [
        (n, c)
        for s, n, c in zip(timeline.storage.tolist(), timeline.nbytes.tolist(), cats, strict=True)
        if s in gradient_storages
    ]
    assert {c for _, c in events} == {GRADS}
    assert sorted(n for n, _ in events if n > 0) == [16, 64, 256, 512]  # bias 4, bias 16, 16x4, 8x16 floats
    assert sum(n for n, _ in events) == 0
    assert int(timeline.category_curve(GRADS)[-1]) == 0


def test_phases_in_order() -> None:
    timeline, ends = small_step()
    spans = timeline.phase_spans()
    assert [name for name, _, _ in spans] == ["load", "forward", "backward", "optimizer_step"]
    assert spans[0] == ("load", 0, ends["load"] - 1)
    assert spans[1][1] == ends["load"]
    # The backward span starts with the engine; `loss.backward()` first makes the 4-byte seed
    # gradient outside it (still labelled forward).
    assert spans[2][1] in (ends["forward"], ends["forward"] + 1)
    assert spans[3][1] == ends["backward"]
    peaks = timeline.phase_peaks()
    assert list(peaks) == ["load", "forward", "backward", "optimizer_step"]
    assert peaks["load"] == PARAM_BYTES + INPUT_BYTES
    assert max(peaks.values()) == timeline.peak_bytes


def test_forward_allocations_are_attributed_to_the_innermost_module() -> None:
    timeline, ends = small_step()
    forward = slice(ends["load"], ends["forward"])
    allocations = [
        (n, m)
        for n, m in zip(
            timeline.nbytes[forward].tolist(), names(timeline.module[forward], timeline.modules), strict=True
        )
        if n > 0
    ]
    # Linear 0 -> 32x16, ReLU -> 32x16, Linear 2 -> 32x4 floats, then the loss outside any module.
    assert allocations == [(2048, "Sequential.0"), (2048, "Sequential.1"), (512, "Sequential.2"), (4, "")]
    assert {"Sequential.0", "Sequential.1", "Sequential.2"} <= set(timeline.module_peaks())


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 16))

    def forward(self, x: Any) -> Any:
        return self.inner(x) * 2


def test_nested_and_parent_modules_and_a_name_prefix() -> None:
    net, x = Net(), torch.randn(4, 8)
    tracker = MemoryTracker()
    tracker.register_model(net, name="model")
    tracker.register(x)
    with tracker:
        y = net(x)
    timeline = tracker.timeline()
    new = [(n, m) for n, m in zip(timeline.nbytes.tolist(), names(timeline.module, timeline.modules), strict=True)]
    # 4 x 16 floats = 256 B from the inner Linear, then 256 B for `* 2` in Net's own forward.
    assert [item for item in new if item[0] > 0][-2:] == [(256, "model.inner.0"), (256, "model")]
    assert y.shape == (4, 16)


def test_explicit_phase_overrides_automatic_phases() -> None:
    model, _, x = small_model()
    tracker = MemoryTracker()
    tracker.register_model(model)
    tracker.register(x)
    registered = tracker.event_count  # 4 parameter tensors and x
    assert registered == 5
    with tracker:
        with tracker.phase("prefill"):
            model(x).sum().backward()  # forward and backward alike
        edge = tracker.event_count
        out = model(x)
    timeline = tracker.timeline()
    phases = names(timeline.phase, timeline.phases)
    assert set(phases[:registered]) == {"load"}
    assert set(phases[registered:edge]) == {"prefill"}
    assert [name for name, _, _ in timeline.phase_spans()] == ["load", "prefill", "forward"]
    assert set(phases[edge:]) == {"forward"}
    assert out.shape == (32, 4)


def test_paused_records_no_allocations_but_still_records_frees() -> None:
    tracker = MemoryTracker()
    with tracker:
        a = torch.ones(1000)  # +4000
        with tracker.paused():
            b = torch.ones(500)  # not recorded
            del a  # recorded: -4000
        del b  # never tracked: nothing
        c = torch.ones(250)  # +1000
    assert tracker.timeline().nbytes.tolist() == [4000, -4000, 1000]
    assert tracker.current == 1000
    assert c.numel() == 250


def test_capture_stacks_records_the_callers_frame() -> None:
    tracker = MemoryTracker(capture_stacks=True)
    with tracker:
        a = torch.ones(10)
        del a
    timeline = tracker.timeline()
    assert timeline.stack[1] == -1  # frees carry no stack
    stack = timeline.stacks[timeline.stack[0]]
    assert "test_tracker.py" in stack
    assert "test_capture_stacks_records_the_callers_frame" in stack.splitlines()[-1]
    assert "/torch/" not in stack


def test_stacks_are_not_captured_by_default() -> None:
    tracker = MemoryTracker()
    with tracker:
        a = torch.ones(10)
    assert tracker.timeline().stacks == ()
    assert tracker.timeline().stack.tolist() == [-1]
    assert a.numel() == 10


def _global_hook_counts() -> tuple[int, ...]:
    from torch.nn.modules import module as module_hooks
    from torch.optim import optimizer as optim_hooks

    return (
        len(module_hooks._global_forward_pre_hooks),
        len(module_hooks._global_forward_hooks),
        len(optim_hooks._global_optimizer_pre_hooks),
        len(optim_hooks._global_optimizer_post_hooks),
    )


def test_track_registers_and_removes_its_hooks() -> None:
    model, optimizer, x = small_model()
    before = _global_hook_counts()
    with track(model, optimizer, x) as tracker:
        assert isinstance(tracker, MemoryTracker)
        assert tracker.current == PARAM_BYTES + INPUT_BYTES
        assert _global_hook_counts() == tuple(n + 1 for n in before)
        model(x).sum().backward()
        optimizer.step()
    assert _global_hook_counts() == before
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())
    count, current = tracker.event_count, tracker.current
    out = model(x)
    out.sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del out
    assert tracker.event_count == count
    assert tracker.current == current


def test_a_re_entered_tracker_records_frees_again() -> None:
    tracker = MemoryTracker()
    with tracker:
        a = torch.ones(100)  # +400
    with tracker:
        b = torch.ones(200)  # +800
        del b  # -800
    assert tracker.timeline().nbytes.tolist() == [400, 800, -800]
    assert tracker.current == 400
    assert a.numel() == 100


# --- exactness against the CPU allocator (transformers) -----------------------------------------------


@functools.cache
def allocator_comparison(dtype_name: str, checkpointing: bool, lora: bool) -> tuple[int, int, int, int]:
    """One training step of a tiny Llama run under the profiler and the tracker at once.

    Returns (tracker peak - bytes live at start, tracker end - start, profiler peak, profiler end),
    the profiler's figures being the running sum of the CPU allocator's ``[memory]`` events.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # same events; OpenMP threads spin for seconds on a busy 2-core machine
    try:
        return _allocator_comparison(dtype_name, checkpointing, lora)
    finally:
        torch.set_num_threads(threads)


def _tiny_llama_step(dtype_name: str, checkpointing: bool, lora: bool) -> tuple[Any, Any, Any]:
    """A tiny Llama, its AdamW and a batch, the same on every call (seeded)."""
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "estimator"))
    from hf_step import TINY_LLAMA

    config = dict(TINY_LLAMA)
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    hf_config.use_cache = False  # as HF Trainer sets it
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=getattr(torch, dtype_name))
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora:
            peft = pytest.importorskip("peft")
            model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
            if checkpointing:
                model.enable_input_require_grads()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 64))
    return model, optimizer, ids


def _run_step(model: Any, optimizer: Any, ids: Any) -> None:
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    del out
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _registered_tracker(model: Any, optimizer: Any, ids: Any, **options: Any) -> MemoryTracker:
    tracker = MemoryTracker(**options)
    tracker.register_model(model)
    tracker.register_optimizer(optimizer)
    tracker.register(ids, Category.INPUTS)
    return tracker


def _allocator_comparison(dtype_name: str, checkpointing: bool, lora: bool) -> tuple[int, int, int, int]:
    model, optimizer, ids = _tiny_llama_step(dtype_name, checkpointing, lora)
    tracker = _registered_tracker(model, optimizer, ids)
    start = tracker.current
    activities = [torch.profiler.ProfilerActivity.CPU]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.profiler.profile(activities=activities, profile_memory=True) as profile, tracker:
            _run_step(model, optimizer, ids)
    events = [e for e in profile.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    running = list(itertools.accumulate(e.nbytes() for e in events))
    return tracker.peak - start, tracker.current - start, max(running), running[-1]


@functools.cache
def allocator_events_run(dtype_name: str, checkpointing: bool, lora: bool) -> tuple[int, int, Timeline]:
    """The same step (same seed, a fresh model) tracked with ``allocator_events=True``:
    (peak - bytes live at start, end - start, merged timeline)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, optimizer, ids = _tiny_llama_step(dtype_name, checkpointing, lora)
        tracker = _registered_tracker(model, optimizer, ids, allocator_events=True)
        start = tracker.current
        with tracker:
            _run_step(model, optimizer, ids)
        timeline = tracker.timeline()
        return tracker.peak - start, int(timeline.live_bytes[-1]) - start, timeline
    finally:
        torch.set_num_threads(threads)


_SCALARS = "AdamW's `tensor / float` (aten::div): the float wrapped as an 8 B tensor, re-wrapped (8 B) for the dispatch mode, then cast to the parameter dtype inside the kernel"
#: id -> (dtype, gradient checkpointing, LoRA, allocator peak - dispatch-only peak in bytes, what the dispatch
#: mode alone misses: tensors made as operands or inside a kernel, which only ``allocator_events`` sees).
_ALLOCATOR_CASES = {
    "fp32": ("float32", False, False, 20, f"{_SCALARS} (4 B)"),
    "bf16": ("bfloat16", False, False, 18, f"{_SCALARS} (2 B)"),
    "fp32-checkpointing": ("float32", True, False, 20, f"{_SCALARS} (4 B)"),
    "bf16-checkpointing": ("bfloat16", True, False, 18, f"{_SCALARS} (2 B)"),
    "lora-fp32": (
        "float32",
        False,
        True,
        224,
        "28 LoRA `x * scaling` wrapped-scalar operands (8 B each) that autograd saves from forward to backward",
    ),
    "lora-bf16-checkpointing": (
        "bfloat16",
        True,
        True,
        262_112,
        "a CPU type-promotion copy inside MmBackward0 (aten::add > aten::to > aten::_to_copy)",
    ),
}
_PLAIN_CASES = [pytest.param(*case[:3], id=name) for name, case in _ALLOCATOR_CASES.items()]


@requires_hf
@pytest.mark.hf
@pytest.mark.parametrize(("dtype_name", "checkpointing", "lora"), _PLAIN_CASES)
def test_with_allocator_events_the_peak_equals_the_cpu_allocator_peak(
    dtype_name: str, checkpointing: bool, lora: bool
) -> None:
    """The acceptance check: the tracker's peak (allocator events merged) equals the peak of
    the CPU allocator's ``[memory]`` events in an independent profiled run of the same step,
    to the byte; so does the end; and what only the allocator saw is a temporary."""
    _, _, allocator_peak, allocator_end = allocator_comparison(dtype_name, checkpointing, lora)
    peak, end, timeline = allocator_events_run(dtype_name, checkpointing, lora)
    assert peak == allocator_peak
    assert end == allocator_end
    dispatch_peak = allocator_comparison(dtype_name, checkpointing, lora)[0]
    gap = next(case[3] for case in _ALLOCATOR_CASES.values() if case[:3] == (dtype_name, checkpointing, lora))
    assert peak - dispatch_peak == gap  # exactly what the dispatch mode alone misses
    assert timeline.metadata["allocator_events"] is True


@requires_hf
@pytest.mark.hf
@pytest.mark.parametrize(("dtype_name", "checkpointing", "lora"), _PLAIN_CASES)
def test_end_bytes_equal_the_cpu_allocator_and_the_peak_never_exceeds_it(
    dtype_name: str, checkpointing: bool, lora: bool
) -> None:
    tracker_peak, tracker_end, allocator_peak, allocator_end = allocator_comparison(dtype_name, checkpointing, lora)
    assert tracker_end == allocator_end
    assert 0 < tracker_peak <= allocator_peak
