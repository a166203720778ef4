"""An experiment matrix: the runs to make, from a CLI technique list or a YAML file.

CLI: ``--techniques bf16,checkpoint,bf16+checkpoint`` is the control plus one run per comma item
(``+`` combines techniques in one run). A matrix file sets the shared settings and the runs::

    model: llama-3.2-1b        # catalog name | config.json | model dir | module:callable
    steps: 3
    batch: 4
    seq: 256
    optimizer: adamw           # adamw | adafactor | sgd
    device: auto               # auto | cpu | cuda | cuda:N
    tokens: data/train.npy     # optional: 1-D integer tokens (.npy, or .bin of uint16)
    workload: {attention: efficient}   # optional extra workload keys for the predictions
    runs:
      - control
      - bf16+checkpoint
      - {name: "BF16 + budget 0.6", techniques: [bf16, memory-budget=0.6]}

Each run has a key: a hash of everything that decides its measurement (not its display name),
so a results store recognizes a run it has already finished.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramlens._files import LIMITS, read_regular
from vramlens._untrusted import abridge, as_text, brief, load_yaml
from vramlens.errors import InputError
from vramlens.experiments.techniques import AppliedTechnique, combo_label, parse_combo, workload_keys

__all__ = [
    "OPTIMIZERS",
    "Matrix",
    "RunSpec",
    "is_module_reference",
    "load_matrix",
    "matrix_from_list",
    "resolve_device",
]

#: Optimizers the runner builds (torch's own implementations).
OPTIMIZERS = ("adamw", "adafactor", "sgd")
#: Settings a matrix file may hold besides ``runs``.
_SETTINGS = ("model", "steps", "batch", "seq", "optimizer", "device", "tokens", "seed", "workload")
#: Fewest steps: one warm-up, one timed, one measured (the measured step is slowed by the tracker).
MIN_STEPS = 3
#: Largest value of each integer setting (steps of a measurement, a CPU or one-GPU batch).
_MATRIX_MAX = {"steps": 10_000, "batch": 2**20, "seq": 2**24, "seed": 2**63 - 1}


def is_module_reference(model: Any) -> bool:
    """``package.module:callable`` (a user's ``nn.Module`` factory), not a path that exists."""
    if not isinstance(model, str) or model.count(":") != 1 or Path(model).exists():
        return False
    module, func = model.split(":")
    return all(part.isidentifier() for part in [*module.split("."), func])


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; ``cpu``/``cuda``/``cuda:N`` as
    given, when this machine has that GPU (a one-line error otherwise)."""
    text = device.strip().lower()
    if text == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cpu":
        return text
    index = (
        0
        if text == "cuda"
        else int(text[5:])
        if text.startswith("cuda:") and text[5:].isdigit() and len(text) < 12
        else None
    )
    if index is None:
        raise InputError(f"device: {brief(device)}; accepted: auto, cpu, cuda, cuda:N")
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index >= count:
        found = f"{count} CUDA GPU{'s' if count != 1 else ''} (cuda:0 to cuda:{count - 1})" if count else "no CUDA GPU"
        raise InputError(f"device: {text!r}, but torch sees {found} on this machine; accepted here: auto, cpu")
    return text


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One run of a matrix: a model, its settings and the techniques switched on."""

    name: str
    techniques: tuple[AppliedTechnique, ...]
    model: str | Mapping[str, Any]
    """Catalog name, config path, model directory, config dict, or ``module:callable``."""
    steps: int = 3
    batch: int = 4
    seq: int = 256
    optimizer: str = "adamw"
    device: str = "cpu"
    """Resolved: ``cpu``, ``cuda`` or ``cuda:N``."""
    tokens: str | None = None
    """A token file (1-D integers: .npy, or .bin of uint16), else random tokens."""
    seed: int = 0
    workload_extra: Mapping[str, Any] = field(default_factory=dict)
    """Extra workload keys for the predictions (``attention``, ``framework``, ...)."""

    def __post_init__(self) -> None:
        if self.steps < MIN_STEPS:
            raise InputError(f"steps: {self.steps}; at least {MIN_STEPS} (a warm-up, a timed and a measured step)")
        for key in ("batch", "seq"):
            if getattr(self, key) < 1:
                raise InputError(f"{key}: {getattr(self, key)}; must be a positive integer")
        if self.optimizer not in OPTIMIZERS:
            raise InputError(f"optimizer: {brief(self.optimizer)}; accepted: {', '.join(OPTIMIZERS)}")
        if not self.name.strip():
            raise InputError("runs: a run's name must not be empty")

    @property
    def label(self) -> str:
        """The techniques as one label (``bf16+checkpoint``; ``control``)."""
        return combo_label(self.techniques)

    @property
    def memory_budget(self) -> float | None:
        """The compile activation memory budget, when the run sets one."""
        return next((a.value for a in self.techniques if a.value is not None), None)

    @property
    def compiled(self) -> bool:
        return any(a.technique.compiles for a in self.techniques)

    def config(self) -> dict[str, Any]:
        """Everything that decides the measurement (JSON-safe); the key hashes it."""
        model = self.model if isinstance(self.model, str) else dict(self.model)
        return {
            "model": model,
            "techniques": [a.label for a in self.techniques],
            "steps": self.steps,
            "batch": self.batch,
            "seq": self.seq,
            "optimizer": self.optimizer,
            "device": self.device,
            "tokens": self.tokens,
            "seed": self.seed,
        }

    @property
    def key(self) -> str:
        """16 hex digits of the SHA-256 of :meth:`config` (canonical JSON)."""
        text = json.dumps(self.config(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def workload(self) -> dict[str, Any] | None:
        """The run as a workload (``docs/WORKLOAD.md``) for the estimator and simulator; None for
        a user's module (no config to predict from). The optimizer implementation is torch's
        default on the device: a per-tensor loop on CPU, foreach on CUDA."""
        if is_module_reference(self.model):
            return None
        from vramlens.model.resolve import model_from_config

        model = self.model if isinstance(self.model, str) else model_from_config(dict(self.model), name="config")
        workload: dict[str, Any] = {
            "model": model,
            "mode": "train",
            "framework": "hf",
            "precision": "fp32",
            "optimizer": self.optimizer,
            "optimizer_impl": "per-tensor" if self.device == "cpu" else "foreach",
            "batch": self.batch,
            "seq": self.seq,
            "attention": "sdpa",
        }
        return workload | workload_keys(self.techniques) | dict(self.workload_extra)


@dataclass(frozen=True, kw_only=True)
class Matrix:
    """The runs of one experiment, in order; no two with the same key."""

    runs: tuple[RunSpec, ...]

    def __post_init__(self) -> None:
        if not self.runs:
            raise InputError("runs: the matrix has no runs")
        seen: dict[str, str] = {}
        for run in self.runs:
            if run.key in seen:
                raise InputError(f"runs: {seen[run.key]!r} and {run.name!r} are the same configuration")
            seen[run.key] = run.name


def matrix_from_list(
    model: str | Mapping[str, Any], techniques: str | Sequence[str], *, control: bool = True, **settings: Any
) -> Matrix:
    """The control (unless ``control=False``) and one run per item of ``techniques``
    (``"bf16,checkpoint,bf16+checkpoint"`` or a list); ``settings`` are :class:`RunSpec` fields."""
    items = [t.strip() for t in (techniques.split(",") if isinstance(techniques, str) else techniques) if t.strip()]
    combos = ([()] if control else []) + [parse_combo(item) for item in items]
    settings = _settings(settings)
    return Matrix(runs=tuple(RunSpec(name=combo_label(c), techniques=c, model=model, **settings) for c in combos))


def load_matrix(
    path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None, *, trust_model_code: bool = False
) -> Matrix:
    """A matrix from a YAML (or JSON) file; ``overrides`` (CLI flags) win over its settings.

    A ``model: module:callable`` in the file (a factory vramlens would import and call) is
    refused unless ``trust_model_code`` (``--trust-model-code``, a flag the user types): a
    matrix file someone sent you never runs code by itself. A module reference in
    ``overrides`` (the MODEL argument the user typed) needs no flag."""
    target = Path(path)
    kind = LIMITS["matrix"]
    raw = read_regular(target, kind, InputError)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"--config: {str(target)!r}: not UTF-8 text; expected {kind.what}") from None
    data = load_yaml(text, name=f"--config: {str(target)!r}")
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise InputError(f"--config: {str(target)!r} must be a mapping with a 'runs' list")
    unknown = [key for key in data if key not in (*_SETTINGS, "runs")]
    if unknown:
        raise InputError(f"--config: unknown key {brief(unknown[0])}; accepted: {', '.join((*_SETTINGS, 'runs'))}")
    settings = {k: v for k, v in data.items() if k != "runs"} | {
        k: v for k, v in (overrides or {}).items() if v is not None
    }
    if "model" not in settings:
        raise InputError("model: required (the MODEL argument or 'model:' in the matrix file)")
    model = settings.pop("model")
    if not isinstance(model, (str, Mapping)) or (isinstance(model, str) and not 0 < len(model) <= 4096):
        raise InputError(
            f"model: {brief(model)}; a catalog name, config.json, model directory, config mapping or module:callable"
        )
    from_file = (overrides or {}).get("model") is None
    if from_file and is_module_reference(model) and not trust_model_code:
        raise InputError(
            f"model: {brief(model)} in {str(target)!r} names a Python factory to import and call; vramlens runs code "
            "named by a file only with --trust-model-code (give it if you wrote or checked this file)"
        )
    runs = tuple(_run(entry, model, _settings(settings)) for entry in data["runs"])
    return Matrix(runs=runs)


def _run(entry: Any, model: Any, settings: dict[str, Any]) -> RunSpec:
    if isinstance(entry, str):
        combo = parse_combo(entry)
        return RunSpec(name=combo_label(combo), techniques=combo, model=model, **settings)
    if not isinstance(entry, dict) or set(entry) - {"name", "techniques"}:
        raise InputError(f"runs: {brief(entry)}; each run is a technique label or {{name, techniques: [...]}}")
    combo = parse_combo(entry.get("techniques") or [])
    name = entry.get("name")
    if name is not None and not isinstance(name, (str, int, float)):
        raise InputError(f"runs: name {brief(name)}; a run's name is text")
    return RunSpec(name=as_text(name or combo_label(combo), 200), techniques=combo, model=model, **settings)


def _settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """RunSpec fields from matrix settings: device resolved, ``workload`` renamed, numbers checked."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if value is None:
            continue
        if key in ("steps", "batch", "seq", "seed"):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MATRIX_MAX[key]:
                raise InputError(f"{key}: {brief(value)}; must be an integer from 0 to {_MATRIX_MAX[key]:,}")
            out[key] = value
        elif key == "device":
            if not isinstance(value, str):
                raise InputError(f"device: {brief(value)}; accepted: auto, cpu, cuda, cuda:N")
            out["device"] = resolve_device(value)
        elif key == "workload":
            if not isinstance(value, Mapping):
                raise InputError(f"workload: {brief(value)}; must be a mapping of workload keys")
            out["workload_extra"] = dict(value)
        elif key in ("optimizer", "tokens"):
            if not isinstance(value, str):
                raise InputError(f"{key}: {brief(value)}; must be text")
            out[key] = abridge(value, 4096)
        else:
            raise InputError(f"{brief(key)}: not a matrix setting; accepted: {', '.join(_SETTINGS)}")
    if "device" not in out:
        out["device"] = resolve_device("auto")
    return out
