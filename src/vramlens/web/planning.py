"""Plans of the web API, each in a process of its own: :class:`PlanRunner`.

A plan is seconds of pure-Python work. In a thread of the server it would hold the GIL the
event loop needs to answer estimates, it could only be stopped by asking it to stop, and what
it allocated would stay in the server's heap. In a process of its own (forked from a
``forkserver`` that has vramlens imported, ~20 ms):

* it runs beside the event loop, not in turns with it, and at a lower priority (``nice``): the
  estimates the page asks for keep their speed while plans run;
* it is stopped at once, by killing it, when the client goes away, when the server stops
  (SIGTERM, Ctrl+C: :meth:`PlanRunner.stop_all`) or when it runs past its budget;
* its memory goes back to the system when it ends.

The work of one plan is bounded twice: by its :class:`~vramlens.planner.budget.PlanBudget` inside
(a one-line :class:`~vramlens.planner.budget.PlanTooLarge` past :data:`WEB_PLAN_ESTIMATES`
estimates or :data:`WEB_PLAN_SECONDS`), and by the runner, which kills a child that has not
answered :data:`GRACE_S` seconds after that. Where ``forkserver`` does not exist (Windows) the
plan runs in a worker thread and is stopped through its budget's cancel switch.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any, Final

from vramlens.errors import InputError, VramlensError
from vramlens.planner.budget import PlanBudget, PlanCancelled, PlanTooLarge

__all__ = ["GRACE_S", "WEB_CODE_SECONDS", "WEB_PLAN_ESTIMATES", "WEB_PLAN_SECONDS", "PlanRunner", "read_code"]

#: Work one web plan may do: configurations estimated (~0.15 ms each) and seconds.
WEB_PLAN_ESTIMATES: Final = 100_000
WEB_PLAN_SECONDS: Final = 20.0
#: Seconds the process that reads or traces a model's code (:func:`read_code`) may take: a
#: small model's first trace takes 10 to 45 s on 2 busy cores (``vramlens estimate`` alike).
WEB_CODE_SECONDS: Final = 300.0
#: How much nicer than the server a plan's process runs (CFS gives a nice-10 process a tenth of
#: the share of a nice-0 one): a plan never slows the estimates the page asks for.
NICENESS: Final = 10
#: Seconds a child gets past its own budget before it is killed.
GRACE_S: Final = 10.0
#: Modules the fork server imports once, so that each plan's process starts warm.
_PRELOAD: Final = ["vramlens.planner", "vramlens.web.present", "vramlens.web.uploads", "vramlens.estimator.time"]
_ERRORS: Final[dict[str, type[VramlensError]]] = {"PlanTooLarge": PlanTooLarge, "InputError": InputError}

#: ``(model recipe, normalised workload, headroom, allow_method_change, top)``: plain data, as it
#: is pickled to the plan's process (a :class:`~vramlens.model.spec.ModelSpec` is not).
Arguments = tuple[tuple[Any, ...], dict[str, Any], float, bool, int]


def _answer(arguments: Arguments, budget: PlanBudget) -> dict[str, Any]:
    """``{"plan", "view"}`` of a plan (what ``POST /api/plan`` answers)."""
    from vramlens.planner import plan
    from vramlens.web.present import present_plan
    from vramlens.web.uploads import build_model

    recipe, workload, headroom, method, top = arguments
    workload = {**workload, "model": build_model(recipe)}
    result = plan(workload, headroom=headroom, allow_method_change=method, max_candidates=top, budget=budget)
    return {"plan": result.to_dict(), "view": present_plan(result, top=top)}


def read_code(arguments: tuple[Any, ...], budget: PlanBudget) -> dict[str, Any]:
    """Read or trace a model's code into the recipe cache, for a server that does not
    (:func:`vramlens.model.generic.store.code_reading`): ``("config", bytes, name)`` describes an
    uploaded config, ``("estimate", model recipe, workload dict)`` estimates a workload (tracing
    its layer recipe). The answer is empty: the server answers from the cache afterwards."""
    from vramlens.estimator import estimate
    from vramlens.model.generic.store import code_reading
    from vramlens.web.uploads import UploadStore, build_model, parse_upload

    with code_reading(True):
        if arguments[0] == "config":
            parse_upload(arguments[1], arguments[2], UploadStore())
        else:
            estimate({**arguments[2], "model": build_model(arguments[1])})
    return {}


Target = Callable[[Any, PlanBudget], dict[str, Any]]


def _child(connection: Connection, target: Target, arguments: Any) -> None:
    """The plan process: one message back, ``("ok", answer)`` or ``("error", kind, message)``.
    It runs at a lower priority (nice +:data:`NICENESS`): the server's estimates go first."""
    with contextlib.suppress(AttributeError, OSError):
        os.nice(NICENESS)
    try:
        budget = PlanBudget(max_estimates=WEB_PLAN_ESTIMATES, max_seconds=WEB_PLAN_SECONDS)
        message: tuple[Any, ...] = ("ok", target(arguments, budget))
    except VramlensError as error:
        message = ("error", type(error).__name__, str(error))
    except BaseException as error:  # a bug: the parent answers 500 with it
        message = ("bug", type(error).__name__, " ".join(str(error).split())[:300])
    connection.send(message)
    connection.close()


def _context() -> Any:
    """The ``forkserver`` context (its server started with vramlens imported), or None."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


class PlanRunner:
    """Runs web plans in child processes (module docstring); one per app."""

    def __init__(self) -> None:
        self._context = _context()
        self._children: set[Any] = set()
        self._stopping = threading.Event()

    def start(self) -> None:
        """Start the fork server now (it imports vramlens once: ~1 s), not at the first plan."""
        if self._context is not None:
            from multiprocessing import forkserver

            forkserver.ensure_running()

    def stop_all(self) -> None:
        """Kill every running plan and refuse new ones (the server is stopping)."""
        self._stopping.set()
        for child in list(self._children):
            child.kill()

    async def run(
        self,
        arguments: Any,
        withdrawn: Callable[[], Awaitable[bool]],
        *,
        target: Target = _answer,
        seconds: float = WEB_PLAN_SECONDS,
        what: str = "plan",
    ) -> dict[str, Any]:
        """The answer of one plan (or of another ``target``, e.g. :func:`read_code`, named
        ``what`` in messages); :class:`PlanCancelled` when ``withdrawn()`` turns true (the client
        left) or the server stops; :class:`PlanTooLarge` past the budget or ``seconds``."""
        if self._stopping.is_set():
            raise PlanCancelled(f"{what}: cancelled (the server is stopping)")
        if self._context is None:
            return await self._in_thread(arguments, withdrawn, target)
        receive, send = self._context.Pipe(duplex=False)
        child = self._context.Process(target=_child, args=(send, target, arguments), daemon=True)
        child.start()
        send.close()
        self._children.add(child)
        try:
            message = await self._wait(child, receive, withdrawn, seconds + GRACE_S, what)
        finally:
            if child.is_alive():
                child.kill()
            child.join(timeout=5)
            receive.close()
            self._children.discard(child)
        if message[0] == "ok":
            answer: dict[str, Any] = message[1]
            return answer
        if message[0] == "error":
            raise _ERRORS.get(message[1], InputError)(message[2])
        raise RuntimeError(f"{message[1]}: {message[2]}")

    async def _wait(
        self, child: Any, receive: Connection, withdrawn: Callable[[], Awaitable[bool]], limit_s: float, what: str
    ) -> Any:
        """The child's message, watching the client, the stop switch and the deadline meanwhile."""
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        loop.add_reader(receive.fileno(), ready.set)
        deadline = time.monotonic() + limit_s
        try:
            while not ready.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ready.wait(), timeout=0.2)
                if ready.is_set():
                    break
                if self._stopping.is_set() or await withdrawn():
                    raise PlanCancelled(f"{what}: cancelled (the server is stopping or the client went away)")
                if not child.is_alive():
                    raise RuntimeError(f"the {what}'s process ended without an answer (exit code {child.exitcode})")
                if time.monotonic() > deadline:
                    narrow = "narrow the search" if what == "plan" else "try vramlens on the command line"
                    raise PlanTooLarge(f"{what}: no answer within {limit_s:g} s; {narrow}")
        finally:
            loop.remove_reader(receive.fileno())
        return await asyncio.to_thread(receive.recv)

    async def _in_thread(
        self, arguments: Any, withdrawn: Callable[[], Awaitable[bool]], target: Target
    ) -> dict[str, Any]:
        """Without a fork server: the plan in a worker thread, stopped through its budget."""
        left = threading.Event()
        budget = PlanBudget(
            max_estimates=WEB_PLAN_ESTIMATES, max_seconds=WEB_PLAN_SECONDS, cancel=(left, self._stopping), yield_every=4
        )
        task = asyncio.ensure_future(asyncio.to_thread(target, arguments, budget))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.2)
                if done:
                    return task.result()
                if await withdrawn():
                    left.set()
        except asyncio.CancelledError:
            left.set()
            raise
