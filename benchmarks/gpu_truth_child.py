"""The runs of ``benchmarks/gpu_truth.py``: one measured CUDA run per child process, and simulations.

A training run is the step the simulator runs (``vramlens.simulator.train``): the model computes its
loss from ``labels``; under mixed precision autocast and the logits converted to fp32 as
accelerate does; ``loss.backward()``, fused AdamW ``step()``, ``zero_grad(set_to_none=True)``;
three steps. LoRA adapters are PEFT's (all linear layers, r=16); QLoRA loads the base as
bitsandbytes NF4 with double quantization (skipped without bitsandbytes). An inference run is
``model.generate`` with ``min_new_tokens = max_new_tokens`` (greedy). Models are built from the
catalog's config with random weights on the GPU (no download); the cache is emptied after
loading (``from_config`` leaves the untied LM head's segment cached, which ``from_pretrained`` does not).
"""

from __future__ import annotations

import importlib.metadata
import json
import pickle
import subprocess
import time
from pathlib import Path
from typing import Any

SNAPSHOT_EVENTS = 4000


def environment() -> dict[str, Any]:
    """Library versions, the GPU and its driver (nvidia-smi), for ``battery.json``."""
    versions = {}
    for package in ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "vramlens"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        gpu = subprocess.run(query, capture_output=True, text=True, timeout=20, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        gpu = None
    return {"versions": versions, "gpu": gpu}


def _nvidia_smi_bytes(pid: int) -> int | None:
    """``used_memory`` nvidia-smi reports for process ``pid`` (MiB), in bytes; None if it cannot say."""
    query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    try:
        lines = subprocess.run(query, capture_output=True, text=True, timeout=20, check=False).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in lines:
        fields = [field.strip() for field in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
            return int(fields[1]) * 2**20
    return None


def _model(workload: Any, torch: Any) -> Any:
    """The transformers model of the workload on the GPU, random weights, with PEFT adapters."""
    from vramlens.estimator.infer.context import resolve_inference
    from vramlens.resolve.context import resolve_training
    from vramlens.simulator.build import hf_config, torch_dtype

    transformers = __import__("transformers")
    infer = workload.mode.value == "infer"
    ctx = resolve_inference(workload.model, workload, None) if infer else resolve_training(workload.model, workload)
    config = hf_config(workload.model, ctx.attention)
    config.use_cache = infer
    dtype = torch_dtype(workload.precision, ctx.compute_bytes if infer else ctx.frozen_bytes)
    quantization = None
    if workload.method.value == "qlora":
        quantization = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )  # fmt: skip
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    if quantization is not None:  # quantize the random bf16 weights as from_pretrained would
        model = _quantized(model, quantization, torch)
    if workload.method.value in ("lora", "qlora"):
        peft = __import__("peft")
        if quantization is not None:
            model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    return model


def _quantized(model: Any, quantization: Any, torch: Any) -> Any:
    """Replace every decoder ``nn.Linear`` by a bitsandbytes NF4 linear holding its weights."""
    bnb = __import__("bitsandbytes")
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and "lm_head" not in f"{name}.{child_name}":
                layer = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                          compute_dtype=torch.bfloat16, quant_type="nf4")  # fmt: skip
                layer.weight = bnb.nn.Params4bit(child.weight.data.cpu(), requires_grad=False, quant_type="nf4")
                setattr(module, child_name, layer.cuda())
    torch.cuda.empty_cache()
    return model


def _train(model: Any, workload: Any, torch: Any) -> None:
    if workload.recompute.value == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if workload.method.value != "full":
            model.enable_input_require_grads()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, fused=True)
    ids = torch.randint(0, model.config.vocab_size, (workload.batch, workload.seq), device="cuda")
    mixed = workload.precision.value.startswith("mixed")
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mixed):
            out = model(input_ids=ids, labels=ids)
        if mixed:
            out["logits"] = out["logits"].float()
        out.loss.backward()
        del out
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _generate(model: Any, workload: Any, torch: Any) -> None:
    prompt = torch.randint(0, model.config.vocab_size, (workload.batch, workload.prompt), device="cuda")
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=workload.generate, min_new_tokens=workload.generate, do_sample=False)


def measure_run(entry: dict[str, Any], out: Path) -> None:
    """Measure one battery entry on the GPU and write ``<id>.measured.json`` (and its snapshot)."""
    import torch

    from vramlens.model.resolve import load_model
    from vramlens.workload.load import load_workload

    workload = load_workload(entry["workload"])
    workload = load_workload(workload, {"model": load_model(workload.model)})
    if workload.method.value == "qlora":
        __import__("bitsandbytes")  # a missing package fails the run with its name
    started = time.monotonic()
    model = _model(workload, torch)
    torch.cuda.synchronize()
    # from_config makes the untied LM head and frees it when the weights are tied: a vocabulary-sized
    # segment left cached that from_pretrained does not leave (the 2026-11-27 battery measured it).
    torch.cuda.empty_cache()
    loaded = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_EVENTS, context=None, stacks="python")
    (_generate if entry["kind"] == "infer" else _train)(model, workload, torch)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    measured = {
        "max_allocated_bytes": torch.cuda.max_memory_allocated(),
        "max_reserved_bytes": torch.cuda.max_memory_reserved(),
        "nvidia_smi_bytes": _nvidia_smi_bytes(__import__("os").getpid()),
        "device_used_bytes": total - free,
        "load_allocated_bytes": loaded[0],
        "load_reserved_bytes": loaded[1],
        "seconds": round(time.monotonic() - started, 2),
    }
    with (out / f"{entry['id']}.snapshot.pickle").open("wb") as file:
        pickle.dump(torch.cuda.memory._snapshot(), file)
    (out / f"{entry['id']}.measured.json").write_text(json.dumps(measured))


def measure_context(out: Path) -> None:
    """The device level outside PyTorch's allocator in a bare process, at four points (``total -
    free`` of ``cudaMemGetInfo``, nvidia-smi's figure, reserved): after the context is made, after
    the first allocation, after a 4096^3 bf16 matmul (cuBLAS loads its kernels and takes its
    workspace) and after an SDPA forward and backward; written to ``context.json``."""
    import torch

    total = torch.cuda.mem_get_info()[1]
    points: dict[str, dict[str, Any]] = {}

    def point(name: str) -> None:
        torch.cuda.synchronize()
        points[name] = {
            "device_used_bytes": total - torch.cuda.mem_get_info()[0],
            "nvidia_smi_bytes": _nvidia_smi_bytes(__import__("os").getpid()),
            "reserved_bytes": torch.cuda.memory_reserved(),
        }

    point("after_init")
    torch.zeros(1, device="cuda")
    point("after_first_allocation")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    point("after_bf16_matmul_4096")
    qkv = [torch.randn(2, 8, 512, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=True).sum().backward()
    point("after_sdpa_forward_backward")
    (out / "context.json").write_text(json.dumps(points))


def simulate_runs(entries: list[dict[str, Any]], out: Path) -> None:
    """Simulate each entry (fake tensors, CPU) and write ``<id>.simulation.json``; failures are skipped."""
    from vramlens.errors import VramlensError
    from vramlens.simulator import simulate

    for entry in entries:
        try:
            report = simulate(entry["workload"])
        except VramlensError:
            continue
        result = {"allocated_bytes": report.allocated_bytes, "reserved_bytes": report.reserved_bytes}
        (out / f"{entry['id']}.simulation.json").write_text(json.dumps(result))
