"""``vramlens.integrations.hf.MemoryCallback``: a real ``transformers.Trainer`` on a tiny Llama on
CPU (no downloads) writes a timeline and a JSON summary that agree; the window, rank file names
and the end-of-training paths, driven by hand with the Trainer's callback arguments.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import requires_hf

pytestmark = [requires_hf, pytest.mark.hf]

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vramlens.categories import Category  # noqa: E402
from vramlens.errors import InputError  # noqa: E402
from vramlens.integrations.hf import MemoryCallback  # noqa: E402
from vramlens.trace import CATEGORY_ORDER, load_timeline  # noqa: E402

VOCAB, SEQ = 128, 16


def tiny_llama() -> Any:
    """A 2-layer Llama (hidden 64, GQA 4/2 heads, vocab 128) in fp32, built from a config."""
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_memory_callback_with_a_real_trainer(tmp_path: Path) -> None:
    model = tiny_llama()
    data = [{"input_ids": torch.randint(0, VOCAB, (SEQ,)), "labels": torch.randint(0, VOCAB, (SEQ,))} for _ in range(8)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "trainer"),
        max_steps=3,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    callback = MemoryCallback(steps=2, start_step=1, output_dir=tmp_path / "memory")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()

    timeline_path = tmp_path / "memory" / "vramlens-memory-rank0.npz"
    summary_path = tmp_path / "memory" / "vramlens-memory-rank0.json"
    assert callback.files == [timeline_path, summary_path]
    timeline = load_timeline(timeline_path)
    summary = json.loads(summary_path.read_text())

    parameters = nbytes(model.parameters())
    state = nbytes(t for s in trainer.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))
    assert state == 2 * parameters + 4 * len(list(model.parameters()))  # AdamW moments + fp32 step counters
    # Registered when step 1 began (step 0 made the AdamW state): parameters, state, rotary buffers.
    load = next(span for span in timeline.phase_spans() if span[0] == "load")
    assert timeline.breakdown_at(load[2]) == {
        Category.PARAMETERS: parameters,
        Category.OPTIMIZER_STATE: state,
        Category.BUFFERS: nbytes(model.buffers()),
    }
    assert timeline.peak_bytes > parameters + state
    assert {"forward", "backward", "optimizer_step"} <= set(timeline.phase_peaks())
    assert [s["step"] for s in timeline.metadata["steps"]] == [1, 2]

    # The summary agrees with the timeline.
    assert summary["timeline"] == timeline_path.name
    assert (summary["rank"], summary["events"], summary["peak_bytes"]) == (0, len(timeline), timeline.peak_bytes)
    breakdown = timeline.breakdown_at()
    assert summary["breakdown_at_peak"] == {str(c): n for c, n in breakdown.items()}
    assert sum(summary["breakdown_at_peak"].values()) == summary["peak_bytes"]
    assert summary["phase_peaks"] == timeline.phase_peaks()
    assert summary["peak_phase"] == timeline.phases[timeline.phase[timeline.peak_index]]
    assert set(summary["step_peaks"]) == {"1", "2"}
    assert max(summary["step_peaks"].values()) == summary["peak_bytes"]
    assert summary["metadata"]["device"] == "cpu"


def _drive(callback: MemoryCallback, tmp_path: Path, *, steps: int, rank: int = 0) -> None:
    """Call the callback as Trainer does, for ``steps`` optimizer steps of a small AdamW loop."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)  # 36 floats = 144 B
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    args = SimpleNamespace(output_dir=str(tmp_path), process_index=rank, world_size=rank + 1)
    state, control = SimpleNamespace(global_step=0), SimpleNamespace()
    kwargs = {"model": model, "optimizer": optimizer, "lr_scheduler": None}
    for _ in range(steps):
        callback.on_step_begin(args, state, control, **kwargs)
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state.global_step += 1
        callback.on_step_end(args, state, control, **kwargs)
    callback.on_train_end(args, state, control, **kwargs)


def test_training_that_ends_inside_the_window_still_writes_its_rank_file(tmp_path: Path) -> None:
    callback = MemoryCallback(steps=5, start_step=2)
    _drive(callback, tmp_path, steps=3, rank=3)  # steps 0, 1, 2: only step 2 is tracked
    assert [p.name for p in callback.files] == ["vramlens-memory-rank3.npz", "vramlens-memory-rank3.json"]
    assert callback.summary is not None
    assert callback.summary["rank"] == 3 and callback.summary["metadata"]["world_size"] == 4
    assert list(callback.summary["step_peaks"]) == ["2"]
    # Registered at step 2: parameters 144 B (2 tensors), AdamW state 2 x 144 B + 2 step counters
    # of 4 B (6 tensors): 8 events.
    timeline = load_timeline(callback.files[0])
    assert timeline.breakdown_at(7) == {Category.PARAMETERS: 144, Category.OPTIMIZER_STATE: 296}
    # Then the step's own batch (4 x 8 floats), an input of the model's forward.
    assert (int(timeline.nbytes[8]), CATEGORY_ORDER[timeline.category[8]]) == (128, Category.INPUTS)


def test_nothing_tracked_warns_and_writes_nothing(tmp_path: Path) -> None:
    callback = MemoryCallback(steps=1, start_step=10)
    with pytest.warns(UserWarning, match="MemoryCallback: no step tracked"):
        _drive(callback, tmp_path, steps=2)
    assert callback.files == [] and not list(tmp_path.iterdir())


def test_close_leaves_a_step_that_raised() -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    callback = MemoryCallback(start_step=0)
    model = torch.nn.Linear(2, 2)
    callback.on_step_begin(SimpleNamespace(), SimpleNamespace(global_step=0), SimpleNamespace(), model=model)
    assert _get_current_dispatch_mode() is not None
    callback.close()
    assert _get_current_dispatch_mode() is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"steps": 0}, "^steps: 0; accepted: a whole number, 1 or more"),
        ({"start_step": -1}, "^start_step: -1; accepted: a whole number, 0 or more"),
        ({"steps": 2.5}, "^steps: 2.5; accepted"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        MemoryCallback(**options)


def test_without_transformers_the_import_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys

    from vramlens.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    monkeypatch.delitem(sys.modules, "vramlens.integrations.hf")
    with pytest.raises(MissingExtraError, match=r"install it with: pip install 'vramlens\[hf\]'"):
        importlib.import_module("vramlens.integrations.hf")
