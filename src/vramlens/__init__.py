"""vramlens: how much GPU memory training, fine-tuning, RLHF and inference of a model take.

The public API is what ``__all__`` lists; modules whose names start with an
underscore are private. Heavy optional dependencies (torch, transformers,
matplotlib, the web server) are imported only by the features that need them, and so is every
part of vramlens itself: ``import vramlens`` loads the shared vocabulary (errors, units,
dtypes, categories); each other name below loads its module on first use (PEP 562)."""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from vramlens import _dataclass_cache, _lazy
from vramlens._version import __version__
from vramlens.categories import Category
from vramlens.dtypes import DType, bytes_for, canonical_dtype
from vramlens.errors import (
    CheckpointError,
    ConfigError,
    InputError,
    MissingExtraError,
    ModelNotFoundError,
    VramlensError,
)
from vramlens.units import GB, GiB, format_bytes, format_count, parse_count, parse_size

_dataclass_cache.install()  # the compiled methods of vramlens' dataclasses are kept between runs

if _TYPE_CHECKING:
    from vramlens.estimator import estimate
    from vramlens.estimator.capacity import CapacityAnswer, max_batch, max_context
    from vramlens.hardware import GpuSpec, gpu_table, resolve_gpu
    from vramlens.model import (
        AttentionSpec,
        CatalogEntry,
        CheckpointSummary,
        LayerSpec,
        MlaSpec,
        MlpKind,
        MlpSpec,
        ModelSpec,
        MoeSpec,
        NormKind,
        NormSpec,
        ParameterBreakdown,
        PositionKind,
        PositionSpec,
        QKNorm,
        QuantizationSpec,
        QuantMethod,
        catalog_entries,
        find_entry,
        load_model,
        model_from_config,
        read_checkpoint,
        supported_model_types,
    )
    from vramlens.planner import Plan, plan
    from vramlens.result.report import MemoryReport, PhaseMemory, ServingCapacity, Term
    from vramlens.result.timeline import Timeline
    from vramlens.rlhf import RlhfSetup, load_rlhf, rlhf_estimate
    from vramlens.simulator import SimulationError, simulate, simulate_module
    from vramlens.snapshot import Snapshot, load_snapshot
    from vramlens.trace import load_timeline, save_ranks, save_timeline, track
    from vramlens.trace.profile import profile_step
    from vramlens.workload import LoraConfig, Parallelism, Workload, load_workload, workload_to_dict

#: Public name -> the module that defines it, imported on first access.
_LAZY: dict[str, str] = {
    "estimate": "vramlens.estimator",
    "CapacityAnswer": "vramlens.estimator.capacity",
    "max_batch": "vramlens.estimator.capacity",
    "max_context": "vramlens.estimator.capacity",
    "gpu_table": "vramlens.hardware",
    "GpuSpec": "vramlens.hardware",
    "resolve_gpu": "vramlens.hardware",
    "AttentionSpec": "vramlens.model",
    "catalog_entries": "vramlens.model",
    "CatalogEntry": "vramlens.model",
    "CheckpointSummary": "vramlens.model",
    "find_entry": "vramlens.model",
    "LayerSpec": "vramlens.model",
    "load_model": "vramlens.model",
    "MlaSpec": "vramlens.model",
    "MlpKind": "vramlens.model",
    "MlpSpec": "vramlens.model",
    "model_from_config": "vramlens.model",
    "ModelSpec": "vramlens.model",
    "MoeSpec": "vramlens.model",
    "NormKind": "vramlens.model",
    "NormSpec": "vramlens.model",
    "ParameterBreakdown": "vramlens.model",
    "PositionKind": "vramlens.model",
    "PositionSpec": "vramlens.model",
    "QKNorm": "vramlens.model",
    "QuantizationSpec": "vramlens.model",
    "QuantMethod": "vramlens.model",
    "read_checkpoint": "vramlens.model",
    "supported_model_types": "vramlens.model",
    "Plan": "vramlens.planner",
    "plan": "vramlens.planner",
    "MemoryReport": "vramlens.result.report",
    "PhaseMemory": "vramlens.result.report",
    "ServingCapacity": "vramlens.result.report",
    "Term": "vramlens.result.report",
    "Timeline": "vramlens.result.timeline",
    "load_rlhf": "vramlens.rlhf",
    "rlhf_estimate": "vramlens.rlhf",
    "RlhfSetup": "vramlens.rlhf",
    "simulate": "vramlens.simulator",
    "simulate_module": "vramlens.simulator",
    "SimulationError": "vramlens.simulator",
    "load_snapshot": "vramlens.snapshot",
    "Snapshot": "vramlens.snapshot",
    "load_timeline": "vramlens.trace",
    "save_ranks": "vramlens.trace",
    "save_timeline": "vramlens.trace",
    "track": "vramlens.trace",
    "profile_step": "vramlens.trace.profile",
    "load_workload": "vramlens.workload",
    "LoraConfig": "vramlens.workload",
    "Parallelism": "vramlens.workload",
    "Workload": "vramlens.workload",
    "workload_to_dict": "vramlens.workload",
}

__all__ = [
    "AttentionSpec",
    "CapacityAnswer",
    "CatalogEntry",
    "Category",
    "CheckpointError",
    "CheckpointSummary",
    "ConfigError",
    "DType",
    "GB",
    "GiB",
    "GpuSpec",
    "InputError",
    "LayerSpec",
    "LoraConfig",
    "MemoryReport",
    "MissingExtraError",
    "MlaSpec",
    "MlpKind",
    "MlpSpec",
    "ModelNotFoundError",
    "ModelSpec",
    "MoeSpec",
    "NormKind",
    "NormSpec",
    "Parallelism",
    "ParameterBreakdown",
    "PhaseMemory",
    "Plan",
    "PositionKind",
    "PositionSpec",
    "QKNorm",
    "QuantMethod",
    "QuantizationSpec",
    "RlhfSetup",
    "ServingCapacity",
    "SimulationError",
    "Snapshot",
    "Term",
    "Timeline",
    "VramlensError",
    "Workload",
    "__version__",
    "bytes_for",
    "canonical_dtype",
    "catalog_entries",
    "estimate",
    "find_entry",
    "format_bytes",
    "format_count",
    "gpu_table",
    "load_model",
    "load_rlhf",
    "load_snapshot",
    "load_timeline",
    "load_workload",
    "max_batch",
    "max_context",
    "model_from_config",
    "parse_count",
    "parse_size",
    "plan",
    "profile_step",
    "read_checkpoint",
    "resolve_gpu",
    "rlhf_estimate",
    "save_ranks",
    "save_timeline",
    "simulate",
    "simulate_module",
    "supported_model_types",
    "track",
    "workload_to_dict",
]


def __getattr__(name: str) -> _Any:
    """Import the module behind a lazy public name on first access and cache the name here."""
    return _lazy.lazy_attribute(globals(), _LAZY, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
