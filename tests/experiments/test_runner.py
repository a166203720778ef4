"""The runner on a user's module (``_tiny_module:make``, torch only): the two CPU measurement
routes agree, token files feed the batches, techniques that cannot run are recorded as
skipped, and bad modules or token files are one-line errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from vramlens.errors import InputError
from vramlens.experiments._training import batches, build_trainee
from vramlens.experiments.matrix import RunSpec
from vramlens.experiments.runner import allocator_peak, run_experiment, tracked_peak
from vramlens.experiments.techniques import parse_combo

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


def _spec(techniques: str = "", **fields: object) -> RunSpec:
    settings = {"model": "_tiny_module:make", "device": "cpu", "batch": 2, "seq": 16} | fields
    return RunSpec(name="run", techniques=parse_combo(techniques), **settings)  # type: ignore[arg-type]


def test_allocator_route_sees_what_the_tracker_sees_on_eager_code() -> None:
    # Compiled code is measured from the allocator's events (a dispatch tracker runs it eagerly);
    # on eager code both routes see the same tensors, the allocator also an operator's internal
    # scratch and the scalars Python numbers are wrapped in: never less, a few KiB more at most.
    spec = _spec()
    trainee = build_trainee(spec)
    ids = batches(spec, trainee.vocab_size)
    trainee.step(ids[0])
    tracked, breakdown, _ = tracked_peak(trainee, ids[1])
    allocated, _ = allocator_peak(trainee, ids[2])
    assert tracked <= allocated <= tracked + 16 * 1024
    assert breakdown["parameters"] == sum(p.numel() * 4 for p in trainee.model.parameters())


def test_a_run_measures_speed_and_loss() -> None:
    result = run_experiment(_spec("fused-optimizer", steps=4))
    assert result.skipped is None and result.measured_by == "tracker"
    assert result.measured_peak_bytes and result.measured_peak_bytes > 0
    assert len(result.losses) == 4 and result.loss == result.losses[-1]
    assert result.tokens_per_s == pytest.approx(2 * 16 / result.step_seconds)  # type: ignore[operator]
    assert result.to_dict()["techniques"] == ["fused-optimizer"]


def test_token_file_windows_feed_the_steps(tmp_path: Path) -> None:
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(100, dtype=np.int32) % 64)
    got = batches(_spec(tokens=str(path)), 64)
    assert got[0].tolist() == [list(range(16)), list(range(16, 32))]
    assert got[1][0, 0].item() == 32
    np.save(path, np.arange(100, dtype=np.int32))
    with pytest.raises(InputError, match=r"^tokens: .* has ids outside the model's vocabulary \[0, 64\)"):
        batches(_spec(tokens=str(path)), 64)
    np.save(path, np.arange(10, dtype=np.int32))
    with pytest.raises(InputError, match=r"^tokens: .* holds 10 tokens; one batch needs 32"):
        batches(_spec(tokens=str(path)), 64)
    (tmp_path / "t.txt").write_text("1 2 3")
    with pytest.raises(InputError, match=r"^tokens: .*; accepted: .npy"):
        batches(_spec(tokens=str(tmp_path / "t.txt")), 64)


def test_a_technique_this_machine_lacks_is_a_skipped_row(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "bitsandbytes" else real(name))
    result = run_experiment(_spec("8bit-optimizer"))
    assert result.skipped == "8bit-optimizer: bitsandbytes is not available on this machine"
    assert result.measured_peak_bytes is None


def test_bad_user_modules_are_one_line_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bad_module.py").write_text(
        "import torch\ndef not_module():\n    return 1\ndef no_vocab():\n    return torch.nn.Linear(2, 2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InputError, match=r"^model: 'bad_module:not_module' returned int, not a torch.nn.Module"):
        build_trainee(_spec(model="bad_module:not_module"))
    with pytest.raises(InputError, match=r"^model: 'bad_module:no_vocab''s module needs a vocab_size"):
        build_trainee(_spec(model="bad_module:no_vocab"))
    with pytest.raises(InputError, match=r"^model: cannot import 'bad_module:missing'"):
        build_trainee(_spec(model="bad_module:missing"))
    with pytest.raises(InputError, match=r"^techniques: checkpoint needs a model with gradient_checkpointing_enable"):
        build_trainee(_spec("checkpoint"))
