"""``vramlens rlhf --algo ppo --actor llama-3.1-70b --gpus 8 --gpu h100-80gb [...]`` and ``-c rlhf.yaml``.

Per phase of one RLHF step: the per-GPU allocated/reserved/device memory of the busiest GPU,
what each model holds (on the GPU, offloaded to CPU), the transitions between phases with
their PCIe time, the peak phase, whether it fits, recommendations and assumptions. Flags
override the file's keys (:func:`vramlens.rlhf.load_rlhf` documents the file).
"""

from __future__ import annotations

from typing import Any

import click

from vramlens.cli._output import dumps, echo
from vramlens.cli._rlhf_pictures import check_pictures, rlhf_picture_options, show_rlhf_pictures
from vramlens.errors import InputError
from vramlens.units import GiB

__all__ = ["render_rlhf_table", "rlhf_command", "rlhf_overrides"]

_SCALARS = (
    ("algo", "algo"), ("gpu", "gpu"), ("gpus", "gpus"), ("tp", "tp"), ("shard", "shard"), ("cpu_offload", "cpu_offload"),
    ("group_size", "group_size"), ("prompt", "prompt"), ("response", "response"),
    ("rollout_batch", "rollout_batch"), ("micro_batch", "micro_batch"), ("pcie_gbps", "pcie_gbps"),
)  # fmt: skip


def _separate(values: tuple[str, ...]) -> dict[str, str]:
    groups: dict[str, str] = {}
    for value in values:
        role, sep, gpus = value.partition("=")
        if not sep or not role.strip() or not gpus.strip():
            raise InputError(f"--separate: {value!r} is not accepted (ROLE=GPUS, e.g. --separate reward=2)")
        groups[role.strip()] = gpus.strip()
    return groups


def rlhf_overrides(options: dict[str, Any]) -> dict[str, Any]:
    """The setup keys the command's flags give (flags left out give nothing)."""
    out: dict[str, Any] = {key: options[flag] for flag, key in _SCALARS if options.get(flag) is not None}
    for role in ("actor", "critic", "reward", "reference"):
        if options.get(role) is not None:
            out[role] = options[role]
    if options.get("method") is not None:
        out["actor"] = {**({"model": out["actor"]} if "actor" in out else {}), "method": options["method"]}
    if options.get("no_reference"):
        out["reference"] = None
    if options.get("no_reward"):
        out["reward"] = None
    if options.get("precomputed_ref_logprobs"):
        out["precomputed_ref_logprobs"] = True
        out.setdefault("reference", None)
    rollout = {k: options[k] for k in ("engine", "gpu_memory_utilization") if options.get(k) is not None}
    if options.get("rollout_tp") is not None:
        rollout["tp"] = options["rollout_tp"]
    if rollout:
        out["rollout"] = rollout
    for key in ("offload", "colocate"):
        if options.get(key):
            out[key] = ",".join(options[key])
    if options.get("separate"):
        out["separate"] = _separate(options["separate"])
    return out


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GiB:.1f}"


def _models_line(report: Any) -> list[str]:
    setup = report.setup
    lines = []
    for model in setup.models:
        where = model.placement.value + (f" on {model.gpus} GPU(s)" if model.gpus else "")
        base = " (actor base, adapters off)" if model.from_actor_base else ""
        lines.append(
            f"  {model.role:<10} {model.model}{base}: {model.precision} {model.method}, tp {model.tp}, "
            f"shard {model.shard}, {where}"
        )
    if setup.generates:
        ro = setup.rollout
        util = f", gpu_memory_utilization {ro.gpu_memory_utilization}" if ro.engine == "vllm" else ""
        lines.append(f"  {'rollout':<10} {ro.engine}{util}, tp {ro.tp}, {ro.placement.value}")
    return lines


def _phase_rows(report: Any) -> list[str]:
    rows = [f"  {'phase':<16}{'allocated':>10}{'reserved':>10}{'device':>10}  {'group':<9}on GPU (GiB)  |  on CPU"]
    for phase in report.phases:
        on = [
            f"{r}{'*' if s.busy else ''}{'' if s.group == phase.gpu_group else '@' + s.group} {_gib(s.bytes)}"
            for r, s in phase.models.items()
            if s.where == "gpu"
        ]
        off = [r for r, s in phase.models.items() if s.where == "cpu"]
        mark = " <- peak" if phase.name == report.peak_phase else ""
        rows.append(
            f"  {phase.name:<16}{_gib(phase.allocated_bytes):>10}{_gib(phase.reserved_bytes):>10}"
            f"{_gib(phase.device_bytes):>10}  {phase.gpu_group:<9}{', '.join(on) or '-'}  |  {', '.join(off) or '-'}"
            f"{mark}"
        )
    return rows


def _transition_rows(report: Any) -> list[str]:
    rows: list[str] = []
    boundaries: dict[tuple[str, str], list[Any]] = {}
    for t in report.transitions:
        boundaries.setdefault((t.before, t.after), []).append(t)
    for (before, after), moves in boundaries.items():
        seconds = sum(t.seconds for t in moves)
        parts = [
            f"{t.role} {t.action} {_gib(t.bytes)} GiB" + (f" ({t.seconds:.2f} s)" if t.seconds else "") for t in moves
        ]
        rows.append(f"  {before} -> {after}: {'; '.join(parts)}" + (f"  [{seconds:.2f} s]" if seconds else ""))
    return rows


def render_rlhf_table(report: Any) -> str:
    """The terminal report of :func:`vramlens.rlhf.rlhf_estimate` (GiB = 2**30 bytes)."""
    setup = report.setup
    head = f"vramlens rlhf: {setup.algo.value} on {setup.gpus} x {setup.gpu} ({_gib(report.capacity_bytes)} GiB each)"
    tokens = (
        f"  tokens: prompt {setup.prompt} + response {setup.response}; {setup.rollout_batch} prompts x "
        f"{setup.group_size} per step; micro-batch {setup.micro_batch}; PCIe {setup.pcie_gbps:g} GB/s"
    )
    verdict = "fits" if report.fits else "does NOT fit"
    peak = (
        f"peak: {report.peak_phase}: {_gib(report.peak_device_bytes)} GiB device per GPU "
        f"(allocated {_gib(report.peak_allocated_bytes)}, reserved {_gib(report.peak_reserved_bytes)}) of "
        f"{_gib(report.capacity_bytes)} GiB: {verdict} (headroom {_gib(report.headroom_bytes)} GiB)"
    )
    lines = [
        head,
        "models:",
        *_models_line(report),
        tokens,
        "",
        "per GPU, GiB (* = runs in this phase; @group = on another GPU group):",
    ]
    lines += [*_phase_rows(report), "", peak, "", "transitions (per GPU):"]
    lines += _transition_rows(report) or ["  none"]
    lines += ["", "recommendations:"]
    lines += [f"  - {r.text}" for r in report.recommendations] or [
        "  - none needed" if report.fits else "  - none found"
    ]
    lines += ["", "assumptions:", *(f"  - {a}" for a in report.assumptions)]
    return "\n".join(lines)


def _show(report: Any, fmt: str) -> None:
    if fmt == "json":
        click.echo(dumps(report.to_dict(), indent=2))
    else:
        echo(render_rlhf_table(report))


_ROLE_HELP = "model of the {}: catalog name or config path (default: the actor's model)"


@click.command("rlhf")
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), help="RLHF setup file (YAML or JSON).")
@click.option("--algo", default=None, help="ppo | grpo | dpo | rloo | online-dpo")
@click.option("--actor", default=None, help="actor (policy) model: catalog name or config path")
@click.option("--method", default=None, help="actor training method: full | lora | qlora")
@click.option("--critic", default=None, help=_ROLE_HELP.format("critic (ppo)"))
@click.option("--reward", default=None, help=_ROLE_HELP.format("reward model"))
@click.option("--reference", default=None, help=_ROLE_HELP.format("reference"))
@click.option("--no-reference", "no_reference", is_flag=True, help="No reference model (no KL term).")
@click.option("--no-reward", "no_reward", is_flag=True, help="A rule-based reward (no reward model).")
@click.option("--precomputed-ref-logprobs", is_flag=True, help="DPO: reference log-probs computed beforehand.")
@click.option("--gpu", default=None, help="GPU name (h100-80gb, a100-80gb, ...) or a size such as 80GiB")
@click.option("--gpus", default=None, help="GPUs in all (shared group plus separate groups)")
@click.option("--tp", default=None, help="tensor parallelism of every model (per-model in the file)")
@click.option("--shard", default=None, help="none | ddp | zero1 | zero2 | zero3 | fsdp | hsdp")
@click.option("--cpu-offload", default=None, help="actor/critic while training: none | optimizer | optimizer+params")
@click.option("--group-size", default=None, help="responses per prompt (grpo G, rloo k)")
@click.option("--prompt", default=None, help="prompt tokens per sequence")
@click.option("--response", default=None, help="response tokens per sequence")
@click.option("--rollout-batch", default=None, help="prompts per step (all GPUs)")
@click.option("--micro-batch", default=None, help="sequences per GPU per forward/backward")
@click.option("--engine", default=None, help="rollout engine: hf | vllm")
@click.option("--gpu-memory-utilization", default=None, type=float, help="vLLM rollout: fraction of each GPU")
@click.option("--rollout-tp", default=None, help="tensor parallelism of the rollout engine")
@click.option("--offload", multiple=True, help="ROLE[,ROLE]: sleep on CPU between its phases")
@click.option("--colocate", multiple=True, help="ROLE[,ROLE]: keep on the GPU all step (e.g. a vLLM rollout)")
@click.option("--separate", multiple=True, help="ROLE=GPUS: a GPU group of its own (repeatable)")
@click.option("--pcie-gbps", default=None, type=float, help="host<->GPU bandwidth, GB/s (default 25)")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@rlhf_picture_options
def rlhf_command(
    config: str | None,
    fmt: str,
    ascii_only: bool,
    plot_path: str | None,
    html_path: str | None,
    timeline: bool,
    **options: Any,
) -> None:
    """Per-GPU memory of each phase of an RLHF step: generation, scoring, reference, values, training."""
    from vramlens.rlhf import load_rlhf, rlhf_estimate

    overrides = rlhf_overrides(options)
    if config is None and "actor" not in overrides:
        raise InputError("--actor: give the actor model (e.g. --actor llama-3.1-8b) or a setup file (-c rlhf.yaml)")
    check_pictures(plot_path=plot_path, html_path=html_path)
    setup = load_rlhf(config if config is not None else {}, **overrides)
    report = rlhf_estimate(setup, plan=True)
    _show(report, fmt)
    show_rlhf_pictures(
        report, fmt=fmt, ascii_only=ascii_only, timeline=timeline, plot_path=plot_path, html_path=html_path
    )
