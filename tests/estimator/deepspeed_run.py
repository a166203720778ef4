"""DeepSpeed ZeRO on CPU: two ``engine.backward``/``engine.step`` steps of a tiny HF Llama under
``deepspeed.initialize`` (DeepSpeed's CPU accelerator, gloo), tracked with vramlens'
``StorageTracker``. Run as a script so DeepSpeed's process group and environment stay out of
pytest: ``deepspeed_run.py WORLD BATCH SEQ CASES`` (one process per rank, started here; ``CASES`` a
JSON list of ``[stage, {zero_optimization keys}, checkpointing]``, run one after the other in the same
processes; checkpointing: transformers' ``gradient_checkpointing_enable()``, non-reentrant);
rank 0 prints ``{"peaks": [[...], ...]}``, each case's peak per rank. Used by
tests/estimator/test_deepspeed.py.

What DeepSpeed allocates before the first tracked step (the partitioned bf16 parameters, fp32
master weights, ZeRO-3's gradient partition buffer and reduce bucket) is registered by walking the
engine's optimizer (:func:`_held`), so nothing that exists at the peak is missed. The first step
records ZeRO-3's module trace; the second runs with it complete (prefetch and reuse distance on)."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _config(stage: int, batch: int, extra: dict[str, Any]) -> dict[str, Any]:
    """HF's example ZeRO configs with the values HF Trainer fills for ``auto`` (integrations/deepspeed.py),
    and ``extra`` zero_optimization keys."""
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
        "zero_optimization": zero | extra,
        "bf16": {"enabled": True},
        # torch's fused AdamW (in place, as DeepSpeed's CUDA FusedAdam): FusedAdam is a CUDA op.
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True, "fused": True}},
    }


def _held(engine: Any) -> list[Any]:
    """Every tensor the engine holds before tracking: the module's parameters and buffers, ZeRO-3's
    partitions (``ds_tensor``) and every tensor among the ZeRO optimizer's attributes, in lists and
    dicts (flat bf16 and fp32 partitions, ``grad_partitions_flat_buffer``, the reduce buckets' buffers)."""
    import torch

    found: list[Any] = []

    def walk(value: Any, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif depth < 3 and isinstance(value, (list, tuple)):
            for item in value:
                walk(item, depth + 1)
        elif depth < 3 and isinstance(value, dict):
            for item in value.values():
                walk(item, depth + 1)
        elif depth < 3 and isinstance(getattr(value, "buffer", None), torch.Tensor):
            walk(value.buffer, depth + 1)

    for parameter in engine.module.parameters():
        found.append(parameter)
        walk(getattr(parameter, "ds_tensor", None), 0)
    found += list(engine.module.buffers())
    for name, value in vars(engine.optimizer).items():
        if name not in ("module", "optimizer"):
            walk(value, 0)
    return [t for t in found if not t.is_meta]


def _track_case(rank: int, world: int, case: list[Any], batch: int, seq: int) -> list[int]:
    """One case on one rank: build the model, initialize DeepSpeed, track two steps, gather the peaks."""
    stage, extra, checkpointing = case
    import deepspeed
    import torch
    import transformers
    from hf_step import TINY_LLAMA

    from vramlens.trace.tracker import StorageTracker

    torch.manual_seed(0)
    config = dict(TINY_LLAMA)
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    ds_config = _config(stage, batch, extra)
    with deepspeed.zero.Init(enabled=stage == 3, config_dict_or_path=ds_config):
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    if checkpointing:
        model.gradient_checkpointing_enable()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, batch, seq))
    tracker = StorageTracker()
    tracker.register(_held(engine))
    tracker.register_optimizer(engine.optimizer.optimizer)
    with tracker:
        for step in range(2):
            # DeepSpeed's training loop as its tutorials write it (the model outputs alive through backward).
            outputs = engine(input_ids=ids[step], labels=ids[step])
            engine.backward(outputs.loss)
            engine.step()
    tracker.close()
    peaks = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    torch.distributed.all_gather(peaks, torch.tensor([tracker.peak]))
    engine.destroy()
    return [int(p.item()) for p in peaks]


def run_rank(rank: int, world: int, cases: list[Any], batch: int, seq: int, port: int, out: Any) -> None:
    """One rank: every case in turn; rank 0 puts the peaks."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_SIZE=str(world))
    warnings.simplefilter("ignore")
    found = [_track_case(rank, world, case, batch, seq) for case in cases]
    if rank == 0:
        out.put(found)


if __name__ == "__main__":
    import multiprocessing

    world, batch, seq = (int(value) for value in sys.argv[1:4])
    cases = json.loads(sys.argv[4])
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = 29500 + os.getpid() % 1000
    workers = [context.Process(target=run_rank, args=(r, world, cases, batch, seq, port, queue)) for r in range(world)]
    for worker in workers:
        worker.start()
    result = queue.get(timeout=600)
    for worker in workers:
        worker.join()
    print(json.dumps({"peaks": result}))
