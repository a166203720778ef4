"""Constants of the step-time model (:mod:`vramlens.estimator.time`), each with where it comes from.

The step-time model ranks configurations; it does not promise seconds. Every
number here is a round, documented default, chosen to get *ratios* between
configurations right (recompute vs none, DDP vs ZeRO-3, TP degree, offload),
not to predict a particular cluster.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CPU_ADAM_PARAMS_PER_S",
    "DEFAULT_GPU",
    "GPUS_PER_NODE",
    "INTER_NODE_BYTES_PER_S",
    "LINK_EFFICIENCY",
    "MEMORY_EFFICIENCY",
    "MFU",
    "OPTIMIZER_BYTES_PER_PARAM",
    "OVERLAP",
    "PCIE_BYTES_PER_S",
    "SATURATION_TOKENS",
]

#: Model FLOPs utilisation of a well-tuned dense training step: achieved model FLOPs / peak.
#: Sources: Llama 3 (Dubey et al. 2024, Table 4) reports 38-43% BF16 MFU on H100 for 405B;
#: Megatron-LM (Narayanan et al. 2021) 163 TFLOP/s per A100 = 52% of the 312 TFLOP/s peak
#: for a 1T model; PaLM (Chowdhery et al. 2022) 46.2% MFU; torchtitan (Liang et al. 2024)
#: reports ~30-40% for Llama 3.1 8B on 8 H100s. 0.40 is used for every precision (fp32 runs
#: on the TF32 tensor-core peak, see :func:`vramlens.estimator.time_flops.peak_flops`).
MFU: Final = 0.40

#: Tokens per GPU per micro-batch at which a step reaches half of :data:`MFU` is well below
#: this; the efficiency is scaled by ``t / (t + SATURATION_TOKENS)`` for ``t`` tokens per GPU
#: per micro-batch (2048 tokens: 89%, 512: 67%). A vramlens heuristic for small GEMMs
#: (NVIDIA "Matrix Multiplication Background User's Guide": GEMMs with few rows are
#: memory-bound and suffer wave quantization); it makes larger micro-batches slightly faster
#: than the same tokens split by grad_accum, as measured in practice.
SATURATION_TOKENS: Final = 256

#: Fraction of peak HBM bandwidth memory-bound kernels reach (optimizer step, QLoRA
#: dequantization): ~70-90% in STREAM-like benchmarks on A100/H100 (NVIDIA "CUDA C++ Best
#: Practices Guide", effective bandwidth); 0.7 is used.
MEMORY_EFFICIENCY: Final = 0.7

#: Fraction of a link's per-direction bandwidth NCCL collectives and pinned-memory copies
#: achieve: nccl-tests report ~80% of NVLink bandwidth as bus bandwidth on DGX A100/H100;
#: pinned cudaMemcpy reaches ~25 GB/s of PCIe gen4's 31.5 and ~50 of gen5's 63.
LINK_EFFICIENCY: Final = 0.8

#: PCIe x16 bandwidth per direction in bytes/s (PCI-SIG: 8/16/32 GT/s per lane, 128b/130b).
PCIE_BYTES_PER_S: Final[dict[str, float]] = {"gen3": 15.75e9, "gen4": 31.5e9, "gen5": 63.0e9}

#: Inter-node network bandwidth per GPU (per direction) when a run spans nodes (gpus > 8):
#: DGX A100 has one 200 Gb/s HDR InfiniBand adapter per GPU (25 GB/s); DGX H100/B200 one
#: 400 Gb/s NDR adapter per GPU (50 GB/s) (NVIDIA DGX user guides). Keyed by architecture;
#: anything else uses ``"default"``.
INTER_NODE_BYTES_PER_S: Final[dict[str, float]] = {"hopper": 50e9, "blackwell": 50e9, "default": 25e9}

#: GPUs per node: NVLink (or PCIe peer-to-peer) connects up to 8 GPUs (DGX/HGX); more span nodes.
GPUS_PER_NODE: Final = 8

#: Fraction of each kind of communication hidden behind compute (never 1: something is
#: always exposed). DP gradient reduction is bucketed and overlapped with backward (PyTorch
#: DDP, Li et al. VLDB 2020); ZeRO-3/FSDP prefetch the next unit's all-gather; Megatron TP
#: all-reduces sit on the critical path (overlap is opt-in); PP sends are on the critical
#: path; offload transfers overlap with backward (ZeRO-Offload, Ren et al. 2021).
OVERLAP: Final[dict[str, float]] = {"dp": 0.5, "params": 0.5, "tp": 0.0, "pp": 0.0, "cp": 0.5, "ep": 0.0, "pcie": 0.5}

#: Optimizer-state bytes per trainable parameter an update step reads and writes on the GPU
#: (memory-bound): AdamW reads fp32 master, grad, m, v (16 B) and writes master, m, v and the
#: compute copy (14 B): ~32 B. 8-bit and paged variants read fewer bytes but do extra
#: (de)quantisation work; the model treats them the same (bitsandbytes reports 8-bit Adam
#: at about the speed of 32-bit Adam, Dettmers et al. 2022, "8-bit Optimizers via Block-wise
#: Quantization").
OPTIMIZER_BYTES_PER_PARAM: Final[dict[str, float]] = {"sgd": 16.0, "lion": 24.0, "adafactor": 24.0, "default": 32.0}

#: CPU optimizer throughput, parameters updated per second per node (two sockets), for
#: DeepSpeed's vectorised CPU-Adam, which its ZeRO-Offload tutorial (deepspeed.ai/tutorials/
#: zero-offload) puts at 5-7x PyTorch's CPU Adam. 1e9 params/s = ~2 GB/s of fp32 parameters
#: per socket, the upper end of the ~1-2 GB/s per socket commonly observed; an order of
#: magnitude, not a measurement of any particular host.
CPU_ADAM_PARAMS_PER_S: Final = 1.0e9

#: GPU used for FLOPs and bandwidth when the workload names none or a plain size.
DEFAULT_GPU: Final = "h100-sxm-80gb"
