"""Regenerate the README's pictures in ``docs/images/`` with the tool itself.

Run: ``python benchmarks/readme_pictures.py [--out docs/images]`` (needs the ``[plot]``, ``[torch]``
and ``[hf]`` extras; nothing is downloaded). It writes:

* ``estimate-llama-3.1-8b.png``: ``vramlens estimate llama-3.1-8b --method lora --recompute full
  --gpu a100-80gb --plot ...`` (the README's first command, drawn);
* ``measured-timeline.png``: a real measured timeline. Two AdamW training steps of a small
  transformers Llama built from a config (hidden 256, 4 layers, vocab 32000, fp32, batch 4 x 256
  tokens: 19.3M parameters, random weights) run on the CPU under ``vramlens.track(model, optimizer,
  ids)``; the timeline is saved as ``.npz`` (over its event numbers rather than its nanoseconds, as
  memory_viz draws it: wall-clock time on a shared CPU is stretched by whatever else runs) and drawn
  by ``vramlens view run.npz --plot ...``;
* ``rlhf_grpo_7b.png`` and ``rlhf_ppo_70b.png``: the README's two ``vramlens rlhf`` commands
  (:data:`RLHF_COMMANDS`), drawn with ``--plot`` (core install plus ``[plot]``; ``--rlhf-only``
  makes just these two, without torch).

It prints each file's size (the README keeps each under 200 KB: 72 and 78 KB on 2026-11-22). Two
runs here wrote identical files: the bytes and the order of a CPU step's events do not vary.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}
BATCH, SEQ, STEPS = 4, 256, 2
#: The README's ``vramlens rlhf`` examples: GRPO of a 7B on one 80 GB GPU, PPO of a 70B on eight.
RLHF_COMMANDS: dict[str, tuple[str, ...]] = {
    "rlhf_grpo_7b.png": (
        "--algo", "grpo", "--actor", "qwen2.5-7b", "--method", "lora", "--micro-batch", "2",
        "--gpus", "1", "--gpu", "h100-80gb",
    ),
    "rlhf_ppo_70b.png": (
        "--algo", "ppo", "--actor", "llama-3.1-70b", "--method", "lora", "--critic", "llama-3.1-8b",
        "--reward", "llama-3.1-8b", "--gpus", "8", "--tp", "8", "--gpu", "h100-80gb",
    ),
}  # fmt: skip
MODEL_NAME = "llama-19m (CPU, fp32, AdamW)"


def vramlens(*args: str) -> None:
    """Run the vramlens command line as a user would (a fresh interpreter)."""
    subprocess.run([sys.executable, "-m", "vramlens", *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def tracked_run(path: Path) -> Path:
    """Track ``STEPS`` training steps of the small Llama and save the timeline to ``path``."""
    import torch
    import transformers

    import vramlens
    from vramlens.trace.timeline_io import save_timeline

    config = dict(CONFIG)
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ))
    with vramlens.track(model, optimizer, ids) as tracker:
        for _ in range(STEPS):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    timeline = tracker.timeline()
    metadata = {**timeline.metadata, "model": MODEL_NAME}
    # Drawn over its events, as memory_viz does: wall-clock time on a shared CPU stretches
    # whichever operators another process slowed down (the first tracked forward most).
    events = np.arange(len(timeline), dtype=np.int64)
    return save_timeline(dataclasses.replace(timeline, time=events, time_unit="event", metadata=metadata), path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--rlhf-only", action="store_true", help="only the two RLHF pictures (no torch needed)")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    pictures = []
    for name, flags in RLHF_COMMANDS.items():
        pictures.append(out / name)
        vramlens("rlhf", *flags, "--no-timeline", "--plot", str(pictures[-1]))
    if args.rlhf_only:
        _sizes(pictures)
        return
    estimate = out / "estimate-llama-3.1-8b.png"
    flags = ["--method", "lora", "--recompute", "full", "--gpu", "a100-80gb"]
    vramlens("estimate", "llama-3.1-8b", *flags, "--plot", str(estimate))
    measured = out / "measured-timeline.png"
    with tempfile.TemporaryDirectory() as folder:
        run = tracked_run(Path(folder) / "run.npz")
        vramlens("view", str(run), "--plot", str(measured))
    _sizes([*pictures, estimate, measured])


def _sizes(pictures: list[Path]) -> None:
    for picture in pictures:
        print(
            f"{picture.relative_to(ROOT) if picture.is_relative_to(ROOT) else picture}: {picture.stat().st_size / 1000:.0f} KB"
        )


if __name__ == "__main__":
    main()
