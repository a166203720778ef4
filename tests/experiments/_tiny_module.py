"""A user's module for the experiment tests (``_tiny_module:make``): an embedding, one hidden
layer and a head, with a loss like transformers' (labels shifted inside). ``SLEEP_S`` (from
the environment variable ``TINY_MODULE_SLEEP_S``) slows each forward so that a test can kill
a run while it is in progress. Imports only torch, so a subprocess starts in about a second."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

SLEEP_S = float(os.environ.get("TINY_MODULE_SLEEP_S", "0"))


class Tiny(torch.nn.Module):
    vocab_size = 64

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(self.vocab_size, 32)
        self.hidden = torch.nn.Linear(32, 128)
        self.head = torch.nn.Linear(128, self.vocab_size)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        if SLEEP_S:
            time.sleep(SLEEP_S)
        logits = self.head(torch.relu(self.hidden(self.embed(input_ids))))
        if labels is None:
            return logits
        shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), shifted.flatten(), ignore_index=-100)


def make() -> Tiny:
    return Tiny()
