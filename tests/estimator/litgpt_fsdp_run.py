"""Two LitGPT LoRA steps under litgpt's own FSDP strategy on two CPU processes over gloo: Lightning
Fabric's ``ModelParallelStrategy`` with ``litgpt.finetune.lora.parallelize_fn`` (FSDP2
``fully_shard`` of every checkpoint-wrapped ``Block`` and of the root, activation checkpointing
on), as ``litgpt finetune lora --devices 2`` sets up. Each rank tracks its own peak with vramlens'
``StorageTracker``; rank 0 prints ``{"peaks": [...]}`` as JSON. Run as a script (Fabric re-launches
it once per rank); used by tests/estimator/test_litgpt.py."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(fabric: object) -> None:
    import torch
    from litgpt.lora import GPT, mark_only_lora_as_trainable
    from litgpt_step import fit_steps, litgpt_config

    from vramlens.trace.tracker import StorageTracker

    batch, seq = (int(value) for value in sys.argv[1:3])
    with fabric.init_module(empty_init=False):  # type: ignore[attr-defined]
        model = GPT(litgpt_config(seq))
    mark_only_lora_as_trainable(model)
    model = fabric.setup(model)  # type: ignore[attr-defined]
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(trainable, foreach=True))  # type: ignore[attr-defined]
    torch.manual_seed(0)
    ids = torch.randint(0, 2000, (2, batch, seq))
    tracker = StorageTracker()
    tracker.register([list(model.parameters()), list(model.buffers())])
    with tracker:
        fit_steps(fabric, model, optimizer, [(ids[i], ids[i]) for i in range(2)])
    peaks = fabric.all_gather(torch.tensor(tracker.peak))  # type: ignore[attr-defined]
    if fabric.global_rank == 0:  # type: ignore[attr-defined]
        print(json.dumps({"peaks": [int(p) for p in peaks]}))


if __name__ == "__main__":
    import lightning as L
    from lightning.fabric.strategies import ModelParallelStrategy
    from litgpt.finetune.lora import parallelize_fn

    warnings.simplefilter("ignore")
    strategy = ModelParallelStrategy(parallelize_fn=parallelize_fn, data_parallel_size=2, tensor_parallel_size=1)
    L.Fabric(accelerator="cpu", devices=2, strategy=strategy, precision="bf16-true").launch(main)
