"""Run by tests/trace/test_torchrun.py under ``torchrun --nproc_per_node 2``: each rank tracks one
DDP training step of a small MLP (rank 1 with a batch twice as large) and saves its record;
rank 0 merges them."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import vramlens

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
)
optimizer = torch.optim.AdamW(model.parameters())
batch = torch.randn(32 * (rank + 1), 64)
with vramlens.track(model, optimizer, batch) as tracker:
    model(batch).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
merged = vramlens.save_ranks(tracker, sys.argv[1])
if rank == 0:
    assert merged is not None and len(merged.peaks) == 2
dist.barrier()
dist.destroy_process_group()
