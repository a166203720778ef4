"""How much work one plan may do, and how to stop it: :class:`PlanBudget`.

A search estimates configurations one by one (~0.15 ms each); every estimate first asks the
budget (:meth:`PlanBudget.spend`), which ends the search with a one-line error when

* the plan was cancelled (an event of ``cancel`` set: the server is stopping, the client left):
  :class:`PlanCancelled`;
* it has estimated ``max_estimates`` configurations, or run ``max_seconds``:
  :class:`PlanTooLarge`, whose message says what was searched and how to narrow it.

So no request plans forever, and a stopping server's planner threads end within one estimate.
The budget in force is set around a plan with :func:`budget_scope` (a context variable: each
thread has its own); :func:`vramlens.planner.plan` opens one with :func:`default_budget` (generous:
a command-line plan) unless given another.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Final

from vramlens.errors import InputError, VramlensError

__all__ = [
    "DEFAULT_ESTIMATES",
    "DEFAULT_SECONDS",
    "PlanBudget",
    "PlanCancelled",
    "PlanTooLarge",
    "budget_scope",
    "current_budget",
    "default_budget",
    "spend",
]


class PlanTooLarge(InputError):
    """A plan passed its budget of estimates or seconds."""


class PlanCancelled(VramlensError):
    """A plan was stopped from outside (server shutdown, Ctrl+C, the client went away)."""


@dataclass(kw_only=True)
class PlanBudget:
    """The most estimates and seconds one plan may take, and its cancel switch."""

    max_estimates: int
    max_seconds: float
    cancel: tuple[threading.Event, ...] = ()
    """Any of these set stops the plan (e.g. the server's stop switch and the request's own)."""
    yield_every: int = 0
    """Release the GIL after this many estimates (0: never): a server's planner thread then
    never holds up the thread that answers estimates for more than a few estimates."""
    spent: int = 0
    started: float = field(default_factory=time.monotonic)

    def spend(self) -> None:
        """Count one estimate; raise when the plan must stop (module docstring)."""
        if any(event.is_set() for event in self.cancel):
            raise PlanCancelled("plan: cancelled (the server is stopping or the request was withdrawn)")
        self.spent += 1
        if self.spent > self.max_estimates:
            raise PlanTooLarge(self._message(f"{self.max_estimates:,} configurations estimated"))
        if self.spent % 64 == 0 and time.monotonic() - self.started > self.max_seconds:
            raise PlanTooLarge(self._message(f"{self.max_seconds:g} s of searching"))
        if self.yield_every and self.spent % self.yield_every == 0:
            time.sleep(0)

    def _message(self, limit: str) -> str:
        return (
            f"plan: the search passed its limit of {limit} ({self.spent - 1:,} estimated in "
            f"{time.monotonic() - self.started:.1f} s) before finishing; narrow it: fewer GPUs (parallel.gpus), "
            "a smaller global batch (batch x grad_accum), or no allow_method_change"
        )


#: A command-line plan: 2,000,000 estimates (~5 minutes) or 10 minutes, whichever comes first.
DEFAULT_ESTIMATES: Final = 2_000_000
DEFAULT_SECONDS: Final = 600.0
_CURRENT: ContextVar[PlanBudget | None] = ContextVar("vramlens_plan_budget", default=None)


@contextmanager
def budget_scope(budget: PlanBudget) -> Iterator[PlanBudget]:
    """Run the block with ``budget`` as the plan budget of this thread (or task); its seconds
    count from here (not from when it was made: a web plan may first wait for a slot)."""
    budget.started = time.monotonic()
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)


def default_budget(*cancel: threading.Event) -> PlanBudget:
    """A fresh budget of :data:`DEFAULT_ESTIMATES` estimates and :data:`DEFAULT_SECONDS`."""
    return PlanBudget(max_estimates=DEFAULT_ESTIMATES, max_seconds=DEFAULT_SECONDS, cancel=cancel)


def current_budget() -> PlanBudget | None:
    """The budget in force in this thread or task (None outside :func:`budget_scope`)."""
    return _CURRENT.get()


def spend() -> None:
    """Charge one estimate to the budget in force (nothing outside :func:`budget_scope`)."""
    budget = _CURRENT.get()
    if budget is not None:
        budget.spend()
