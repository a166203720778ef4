"""vramlens: how much GPU memory training, fine-tuning, RLHF and inference of a model take.

The public API is what ``__all__`` lists; modules whose names start with an
underscore are private. Heavy optional dependencies (torch, transformers,
matplotlib, the web server) are imported only by the features that need them.
"""

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
from vramlens.estimate import estimate
from vramlens.estimate.capacity import CapacityAnswer, max_batch, max_context
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
from vramlens.plan import Plan, plan
from vramlens.report.model import MemoryReport, PhaseMemory, ServingCapacity, Term
from vramlens.rlhf import RlhfSetup, load_rlhf, rlhf_estimate
from vramlens.simulate import SimulationError, simulate, simulate_module
from vramlens.snapshot import Snapshot, load_snapshot
from vramlens.trace import Timeline, load_timeline, save_ranks, save_timeline, track
from vramlens.trace.profile import profile_step
from vramlens.units import GB, GiB, format_bytes, format_count, parse_count, parse_size
from vramlens.workload import LoraConfig, Parallelism, Workload, load_workload, workload_to_dict

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
