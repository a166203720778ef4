"""``@vramlens.profile_step``: each call of a step function is tracked with the model, optimizer
and tensors found among its arguments registered; the last N timelines are kept and can be saved.

The model is test_tracker.py's: Linear(8, 16) + ReLU + Linear(16, 4) = 212 floats = 848 B of
parameters; AdamW keeps 2 x 848 B of moments and 4 float32 step counters (16 B); the batch is
32 x 8 floats = 1024 B.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import vramlens  # noqa: E402
from vramlens.categories import Category  # noqa: E402
from vramlens.errors import InputError  # noqa: E402
from vramlens.trace import load_timeline  # noqa: E402
from vramlens.trace.profile import ProfiledStep  # noqa: E402

PARAMS, STATE, INPUTS = 848, 2 * 848 + 4 * 4, 32 * 8 * 4


def small() -> tuple[nn.Module, Any, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), torch.randn(32, 8)


def loaded(timeline: Any) -> dict[Category, int]:
    """The breakdown once registration is done (the load phase's last event)."""
    load = next(span for span in timeline.phase_spans() if span[0] == "load")
    return timeline.breakdown_at(load[2])


@vramlens.profile_step
def train_step(model: Any, optimizer: Any, x: Any) -> float:
    """One AdamW step."""
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def test_bare_decorator_tracks_every_call_and_keeps_the_last() -> None:
    model, optimizer, x = small()
    first = train_step(model, optimizer, x)
    assert isinstance(first, float)  # the step's result passes through
    memory = train_step.memory
    calls_before = memory.calls
    timeline_one = memory.last
    assert timeline_one is not None
    train_step(model, optimizer, x)
    assert memory.calls == calls_before + 1
    assert len(memory.timelines) == 1  # steps=1 by default
    last = memory.last
    assert last is not None and last is not timeline_one
    assert memory.peaks == [last.peak_bytes]
    assert memory.steps == [calls_before]
    # Found among the arguments and registered: parameters, the AdamW state made by the first call, x.
    assert loaded(last) == {Category.PARAMETERS: PARAMS, Category.OPTIMIZER_STATE: STATE, Category.INPUTS: INPUTS}
    assert loaded(timeline_one) == {Category.PARAMETERS: PARAMS, Category.INPUTS: INPUTS}  # no state yet
    assert [name for name, _, _ in last.phase_spans()] == ["load", "forward", "backward", "optimizer_step"]
    # zero_grad(set_to_none=True) frees the gradients: the end is what was registered.
    assert last.breakdown_at(len(last) - 1) == loaded(last)
    assert last.metadata == {
        "source": "vramlens.profile_step",
        "function": "train_step",
        "step": calls_before,
        "device": "cpu",
    }
    assert train_step.__name__ == "train_step" and train_step.__doc__ == "One AdamW step."


def test_keeps_n_steps_in_memory_and_on_disk(tmp_path: Path) -> None:
    """steps=2 keeps the last two steps, as timelines and as files (it wrote every call's file)."""
    model, optimizer, x = small()

    @vramlens.profile_step(steps=2, output=tmp_path / "runs")
    def step(batch: dict[str, Any]) -> None:
        batch["model"](batch["inputs"][0]).sum().backward()
        batch["optimizer"].step()
        batch["optimizer"].zero_grad(set_to_none=True)

    for _ in range(3):
        step({"model": model, "optimizer": optimizer, "inputs": [x]})  # found inside containers too
    assert step.memory.steps == [1, 2]
    assert [p.name for p in step.memory.files] == [f"vramlens-step{n}-rank0.npz" for n in (1, 2)]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [p.name for p in step.memory.files]
    saved = load_timeline(step.memory.files[-1])
    kept = step.memory.timelines[-1]
    assert (saved.peak_bytes, len(saved), saved.metadata["step"]) == (kept.peak_bytes, len(kept), 2)
    assert loaded(kept) == {Category.PARAMETERS: PARAMS, Category.OPTIMIZER_STATE: STATE, Category.INPUTS: INPUTS}


def test_a_file_name_pattern(tmp_path: Path) -> None:
    @vramlens.profile_step(steps=2, output=str(tmp_path / "step-{step:03d}-of-rank{rank}.npz"))
    def step(x: Any) -> Any:
        return x * 2

    step(torch.ones(4))
    step(torch.ones(4))
    assert [p.name for p in step.memory.files] == ["step-000-of-rank0.npz", "step-001-of-rank0.npz"]
    # x (16 B) registered, then x * 2 (16 B) made; nothing else.
    assert load_timeline(step.memory.files[1]).nbytes.tolist() == [16, 16]


def test_explicit_model_and_optimizer_replace_what_is_found() -> None:
    model, optimizer, x = small()

    @vramlens.profile_step(model=model, optimizer=optimizer)
    def closure_step(batch: Any) -> None:  # the model and optimizer are not arguments
        train_step.__wrapped__(model, optimizer, batch)  # type: ignore[attr-defined]

    @vramlens.profile_step
    def unregistered(batch: Any) -> None:
        train_step.__wrapped__(model, optimizer, batch)  # type: ignore[attr-defined]

    closure_step(x)
    unregistered(x)
    assert loaded(closure_step.memory.last) == {Category.PARAMETERS: PARAMS, Category.INPUTS: INPUTS}
    assert loaded(unregistered.memory.last) == {Category.INPUTS: INPUTS}  # parameters existed but were not seen


def test_a_step_that_raises_keeps_its_timeline() -> None:
    @vramlens.profile_step
    def failing(x: Any) -> None:
        kept = torch.ones(250)  # 1000 B
        raise RuntimeError(f"out of memory after {kept.numel()}")

    with pytest.raises(RuntimeError, match="out of memory after 250"):
        failing(torch.ones(1))
    timeline = failing.memory.last
    assert timeline is not None and timeline.peak_bytes == 4 + 1000


class Loop:
    @vramlens.profile_step
    def step(self, model: Any, x: Any) -> Any:
        return model(x)


def test_works_as_a_method() -> None:
    model, _, x = small()
    loop = Loop()
    out = loop.step(model, x)
    assert out.shape == (32, 4)
    assert isinstance(Loop.__dict__["step"], ProfiledStep)
    assert loop.step.memory is Loop.step.memory
    assert loaded(loop.step.memory.last) == {Category.PARAMETERS: PARAMS, Category.INPUTS: INPUTS}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"steps": 0}, "^steps: 0; accepted: a whole number of steps to keep, 1 or more"),
        ({"steps": True}, "^steps: True; accepted"),
        ({"output": "runs/{epoch}.npz"}, r"^output: 'runs/\{epoch\}.npz' is not a valid pattern"),
        ({"output": "run.npz"}, r"^output: 'run.npz' is one file and every call would overwrite it"),
    ],
)
def test_bad_options_are_refused_when_decorating(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        vramlens.profile_step(**options)


def test_an_unsupported_device_is_refused_at_the_call() -> None:
    @vramlens.profile_step(device="mps")
    def step(x: Any) -> None:
        pass

    with pytest.raises(InputError, match=r"^device: 'mps' is not supported"):
        step(torch.ones(1))


def test_the_rank_comes_from_the_environment_without_torch_distributed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "5")

    @vramlens.profile_step(output=tmp_path)
    def step(x: Any) -> None:
        pass

    step(torch.ones(1))
    assert [p.name for p in step.memory.files] == ["vramlens-step0-rank5.npz"]
