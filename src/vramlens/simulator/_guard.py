"""A wall-clock limit on a simulation, so that nothing hangs.

Fake-tensor runs are fast (seconds for a 70B model), but foreign model code can loop for
ever or grow a graph without bound. :func:`deadline` arms a real-time interval timer
(``signal.setitimer``); when it fires, a :class:`SimulationTimeout` is raised in the
running Python code at its next bytecode, which the simulator turns into a one-line
error. Signals reach only the main thread of a POSIX process, so elsewhere (worker
threads, Windows) the block runs without a limit and :func:`deadline` says so.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from vramlens.errors import InputError

__all__ = ["DEFAULT_TIMEOUT_S", "SimulationTimeout", "check_timeout", "deadline", "failure_message"]

#: Default limit (s) of one simulation: 20x the slowest measured case (70B LoRA, two
#: steps: about 26 s on the 2-core reference machine; benchmarks/simulate_speed.py) and far
#: beyond any model the simulator runs normally.
DEFAULT_TIMEOUT_S = 600.0


def failure_message(key: str, what: str, error: Exception, *, advice: str) -> str:
    """The one-line message of a failure inside model or user code on fake tensors: which
    key, what could not be simulated, why (data-dependent code, an operator without a fake
    implementation, the time limit, anything else), the error's first line, and ``advice``."""
    text = str(error).strip()
    first = text.splitlines()[0][:200] if text else ""
    kind = type(error).__name__
    if isinstance(error, SimulationTimeout):
        return f"timeout_s: cannot simulate {what}: {first}; allow more time or {advice}"
    if "DataDependent" in kind or "DynamicOutputShape" in kind:
        why = "it depends on tensor values, which fake tensors do not have (branch on shapes only)"
    elif "Unsupported" in kind or isinstance(error, NotImplementedError):
        why = "it uses an operator without a fake-tensor implementation"
    else:
        why = "it failed on fake tensors"
    return f"{key}: cannot simulate {what}: {why} ({kind}: {first}); {advice}"


def check_timeout(timeout_s: object) -> None:
    """Refuse a limit that is not None or a positive number of seconds (one-line InputError)."""
    number = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
    if timeout_s is not None and not (number and 0 < timeout_s < float("inf")):  # type: ignore[operator]
        raise InputError(f"timeout_s: {timeout_s!r}; accepted: a positive number of seconds, or None for no limit")


class SimulationTimeout(Exception):
    """The simulation ran past its wall-clock limit."""


@contextmanager
def deadline(seconds: float | None) -> Iterator[bool]:
    """Raise :class:`SimulationTimeout` inside the block after ``seconds`` of wall time.

    Yields whether the limit is armed (False with ``seconds=None``, off the main thread, or
    without ``SIGALRM``). A timer already armed by the caller is restored afterwards.
    """
    armable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if seconds is None or not armable:
        yield False
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise SimulationTimeout(f"the simulation ran past its limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # the caller's own timer, less the time spent here (at least 1 ms)
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 0.001))
