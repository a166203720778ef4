"""DeepSpeed ZeRO on CPU: two ``engine.backward``/``engine.step`` steps of a tiny HF Llama under
``deepspeed.initialize`` (DeepSpeed's CPU accelerator, gloo), tracked with vramlens'
``StorageTracker``. Run as a script so DeepSpeed's process group and environment stay out of
pytest: ``deepspeed_run.py STAGE WORLD BATCH SEQ`` (one process per rank, started here); rank 0
prints ``{"peaks": [...]}``. Used by tests/estimator/test_deepspeed.py."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _config(stage: int, batch: int) -> dict[str, Any]:
    """HF's example ZeRO configs with the values HF Trainer fills for ``auto`` (integrations/deepspeed.py)."""
    h = 256  # TINY_LLAMA hidden_size
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": h * h,
    }
    if stage == 3:
        zero |= {"stage3_prefetch_bucket_size": int(0.9 * h * h), "stage3_param_persistence_threshold": 10 * h}
    return {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "bf16": {"enabled": True},
        # torch's fused AdamW (in place, as DeepSpeed's CUDA FusedAdam): FusedAdam is a CUDA op.
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True, "fused": True}},
    }


def run_rank(rank: int, world: int, stage: int, batch: int, seq: int, port: int, out: Any) -> None:
    """One rank: build the model, initialize DeepSpeed, track two steps, gather the peaks."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_SIZE=str(world))
    import deepspeed
    import torch
    import transformers
    from hf_step import TINY_LLAMA

    from vramlens.trace.tracker import StorageTracker

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    config = dict(TINY_LLAMA)
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    with deepspeed.zero.Init(enabled=stage == 3, config_dict_or_path=_config(stage, batch)):
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=_config(stage, batch))
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, batch, seq))
    tracker = StorageTracker()
    optimizer = engine.optimizer
    live = [list(engine.module.parameters()), list(engine.module.buffers())]
    live += [
        [t for group in getattr(optimizer, name, []) for t in (group if isinstance(group, list) else [group])]
        for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "bit16_groups_flat")
    ]
    tracker.register(live)
    tracker.register_optimizer(optimizer.optimizer)
    with tracker:
        for step in range(2):
            # DeepSpeed's training loop as its tutorials write it (the model outputs alive through backward).
            outputs = engine(input_ids=ids[step], labels=ids[step])
            engine.backward(outputs.loss)
            engine.step()
    peaks = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    torch.distributed.all_gather(peaks, torch.tensor([tracker.peak]))
    if rank == 0:
        out.put([int(p.item()) for p in peaks])


if __name__ == "__main__":
    import multiprocessing

    stage, world, batch, seq = (int(value) for value in sys.argv[1:5])
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = 29500 + os.getpid() % 1000
    workers = [context.Process(target=run_rank, args=(r, world, stage, batch, seq, port, queue)) for r in range(world)]
    for worker in workers:
        worker.start()
    result = queue.get(timeout=600)
    for worker in workers:
        worker.join()
    print(json.dumps({"peaks": result}))
