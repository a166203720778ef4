"""Time cost of ``vramlens.trace.tracker.track`` on a real CPU training step.

Run: ``python benchmarks/tracker_overhead.py [--steps 5] [--threads N]``. Prints figures; it is
not a pass/fail test. Target: tracking adds at most 10% to a step of a ~20M-parameter model.

The model is a transformers Llama (hidden 256, 8 layers, MLP 384, 8 heads, vocab 32000,
untied: 20.8M parameters, the size measured in ``docs/research/torch-cpu-probes.md`` section 3),
trained with AdamW on batch 4 x 256 tokens in fp32. One untracked and one tracked warm-up
step come first; then untracked and tracked steps alternate (so drift in the machine's speed
hits both alike); the median of each is reported, and the fastest of each (the figure least
disturbed by other work on a shared machine). A third kind of step runs under a no-op
``TorchDispatchMode``: the part of the overhead any dispatch-mode tracker pays. A tracked step is the whole
``with track(model, optimizer, ids): ...`` block, registration and hook installation included.

Measured 2026-11-22 on the 2-core CI-like machine with nothing else running: 1 thread +4.4%
(fastest +3.3%; the no-op mode alone +5.4%); 2 threads +5.7% and +8.7% (paired +8.1%) in quiet
runs, the no-op mode alone +4..8%. At 2 threads OpenMP scheduling makes single runs swing by
+-10%: rerun, and read the paired and fastest figures beside the median. The tracker's own
Python work is about 2,400 recorded events per step (cProfile: ~10 ms of a 650-1250 ms step).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 384,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}
BATCH, SEQ = 4, 256


def build() -> tuple[Any, Any, Any]:
    """The model, its AdamW optimizer and a batch of token ids."""
    import torch
    import transformers

    config = dict(CONFIG)
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ))
    return model, optimizer, ids


def _no_op_mode() -> Any:
    """A TorchDispatchMode that only forwards each operator: what the mode design costs alone."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class NoOp(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    return NoOp()


def timed(func: Callable[[], object]) -> float:
    start = time.perf_counter()
    func()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=11, help="measured steps of each kind")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()

    import torch

    from vramlens.trace.tracker import track

    if args.threads:
        torch.set_num_threads(args.threads)
    model, optimizer, ids = build()
    peaks: list[int] = []

    def step() -> None:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        del out
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def tracked_step() -> None:
        with track(model, optimizer, ids) as tracker:
            step()
        peaks.append(tracker.peak)

    def bare_mode_step() -> None:
        with _no_op_mode():
            step()

    timed(step)
    timed(tracked_step)
    timed(bare_mode_step)
    plain, tracked, bare = [], [], []
    for _ in range(args.steps):
        plain.append(timed(step))
        tracked.append(timed(tracked_step))
        bare.append(timed(bare_mode_step))
    base, with_tracker = statistics.median(plain), statistics.median(tracked)
    fastest = min(tracked) / min(plain)
    paired = statistics.median(t / p for t, p in zip(tracked, plain, strict=True))
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: Llama {params / 1e6:.1f}M parameters, batch {BATCH} x {SEQ}, AdamW fp32, "
        f"{torch.get_num_threads()} threads, median of {args.steps} steps"
    )
    print(f"{'no tracking':24s} {base * 1e3:9.1f} ms")
    print(f"{'track(model, opt, ids)':24s} {with_tracker * 1e3:9.1f} ms")
    print(f"{'overhead':24s} {with_tracker / base:9.3f}x ({(with_tracker / base - 1) * 100:+.1f}%; target <= +10%)")
    print(f"{'overhead, paired steps':24s} {paired:9.3f}x ({(paired - 1) * 100:+.1f}%; median of each step's ratio)")
    print(f"{'overhead, fastest steps':24s} {fastest:9.3f}x ({(fastest - 1) * 100:+.1f}%)")
    mode_cost = statistics.median(bare) / base
    print(f"{'a no-op dispatch mode':24s} {mode_cost:9.3f}x (the floor of any TorchDispatchMode tracker)")
    print(f"{'tracked peak':24s} {peaks[-1] / 2**20:9.3f} MiB of live tensors")


if __name__ == "__main__":
    main()
