"""The public ``vramlens.track``: its options reach the tracker (``allocator_events`` did not),
``device`` picks the tracker or is refused in one line, and the acceptance check: a real CPU
training step of a tiny transformers Llama tracked with ``allocator_events=True`` has the peak
of the CPU allocator's own ``[memory]`` events (an independent profiled run), to the byte,
with the categories at the peak summing to it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_tracker import _run_step, _tiny_llama_step, allocator_comparison  # noqa: E402
from torch import nn  # noqa: E402

import vramlens  # noqa: E402
from conftest import requires_hf  # noqa: E402
from vramlens.categories import Category  # noqa: E402
from vramlens.errors import InputError  # noqa: E402
from vramlens.trace._cuda import CudaMemoryTracker, resolve_device  # noqa: E402
from vramlens.trace.tracker import MemoryTracker  # noqa: E402

#: Every category the tracker itself assigns (KV cache only through ``set_category``).
TRACKER_CATEGORIES = {
    Category.PARAMETERS,
    Category.GRADIENTS,
    Category.OPTIMIZER_STATE,
    Category.ACTIVATIONS,
    Category.TEMPORARY,
    Category.INPUTS,
    Category.BUFFERS,
    Category.OTHER,
}


def _adamw_step() -> tuple[nn.Module, object, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), torch.randn(32, 8)


def test_allocator_events_pass_through_the_public_wrapper() -> None:
    """``vramlens.track(..., allocator_events=True)`` raised TypeError before the fix."""
    model, optimizer, x = _adamw_step()
    with vramlens.track(model, optimizer, x, allocator_events=True) as tracker:
        model(x).sum().backward()
        optimizer.step()  # type: ignore[attr-defined]
    timeline = tracker.timeline()
    assert timeline.metadata["allocator_events"] is True
    assert timeline.time_unit == "ns"
    assert tracker.peak == timeline.peak_bytes > 0


def test_capture_stacks_pass_through_the_public_wrapper() -> None:
    with vramlens.track(inputs=torch.zeros(2), capture_stacks=True) as tracker:
        kept = torch.ones(10)
    timeline = tracker.timeline()
    assert timeline.stack[-1] >= 0
    assert "test_capture_stacks_pass_through_the_public_wrapper" in timeline.stacks[timeline.stack[-1]]
    assert kept.numel() == 10


@pytest.mark.parametrize("device", [None, "cpu", "cpu:0", torch.device("cpu")])
def test_cpu_devices_give_the_cpu_tracker(device: object) -> None:
    model, _, x = _adamw_step()
    with vramlens.track(model, inputs=x, device=device) as tracker:
        model(x)
    assert type(tracker) is MemoryTracker
    # 848 B of parameters (212 floats) + 1024 B of inputs (32 x 8 floats) registered.
    assert tracker.timeline().breakdown_at(4) == {Category.PARAMETERS: 848, Category.INPUTS: 1024}


@pytest.mark.parametrize(
    ("device", "says"),
    [
        ("mps", "is not supported"),
        ("xpu", "is not supported"),
        ("xpu:0", "is not supported"),
        ("cuda:first", "is not supported"),
        ("tpu", "is not supported"),
        ("cuda", "torch.cuda.is_available() is False"),  # this machine has no GPU
        ("cuda:0", "torch.cuda.is_available() is False"),
        (0, "torch.cuda.is_available() is False"),  # an ordinal means a CUDA device
    ],
)
def test_unsupported_devices_are_refused_in_one_line(device: object, says: str) -> None:
    if torch.cuda.is_available():
        pytest.skip("this check is about a machine without CUDA")
    with pytest.raises(InputError) as caught, vramlens.track(nn.Linear(2, 2), device=device):
        pass
    message = str(caught.value)
    assert message.startswith(f"device: {str(device) if device != 0 else 'cuda:0'!r}")
    assert says in message
    assert "accepted: cpu, cuda, cuda:N" in message
    assert "\n" not in message


def test_device_is_inferred_from_the_model_then_the_inputs() -> None:
    assert resolve_device(None) == "cpu"  # nothing to look at
    assert resolve_device(None, nn.ReLU(), torch.zeros(1)) == "cpu"  # no parameters: the inputs
    meta = nn.Linear(2, 2, device="meta")
    assert resolve_device(None, meta) == "cpu"  # meta (and fake) tensors: the plain tracker
    with pytest.raises(InputError, match=r"^device: 'meta' is not supported"):
        resolve_device("meta")  # asked for by name, it is refused


def test_cuda_tracker_needs_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this check is about a machine without CUDA")
    with pytest.raises(InputError, match=r"^device: 'cuda:0' needs CUDA"):
        CudaMemoryTracker("cuda:0")


# --- acceptance: CPU profiling of a real HF training step ------------------------------------------


@requires_hf
@pytest.mark.hf
def test_public_track_peak_equals_the_cpu_allocator_peak_and_categories_sum_to_it() -> None:
    """fp32 tiny Llama (hidden 256, 4 layers, vocab 2000), one AdamW step on 2 x 64 tokens.

    The profiled reference runs here, just before, not from the module's cache: in a test
    worker the cache may have been filled by another file, before other tests changed what a
    step allocates (CI once saw the two 16 bytes apart that way)."""
    _, _, allocator_peak, allocator_end = allocator_comparison.__wrapped__("float32", False, False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the independent run (same events)
    try:
        model, optimizer, ids = _tiny_llama_step("float32", False, False)
        with vramlens.track(model, optimizer, ids, allocator_events=True) as tracker:
            start = tracker.current  # the registered parameters and ids
            _run_step(model, optimizer, ids)
    finally:
        torch.set_num_threads(threads)
    timeline = tracker.timeline()
    assert timeline.peak_bytes - start == allocator_peak
    assert timeline.end_bytes - start == allocator_end
    breakdown = timeline.breakdown_at(timeline.peak_index)
    assert sum(breakdown.values()) == timeline.peak_bytes
    assert set(breakdown) <= TRACKER_CATEGORIES
    # What the allocator alone saw is labelled, not left out: temporaries exist at some point.
    assert int(timeline.category_curve(Category.TEMPORARY).max()) > 0
    assert {Category.PARAMETERS, Category.INPUTS} <= set(breakdown)
    assert [name for name, _, _ in timeline.phase_spans()][:4] == ["load", "forward", "backward", "optimizer_step"]
