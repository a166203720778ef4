"""The wall-clock limit on simulations ("nothing hangs")."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from click.testing import CliRunner

from conftest import requires_hf
from vramlens.cli.app import cli
from vramlens.errors import InputError
from vramlens.simulator._guard import DEFAULT_TIMEOUT_S, SimulationTimeout, check_timeout, deadline


def test_a_block_that_runs_past_its_limit_is_stopped() -> None:
    started = time.monotonic()
    with pytest.raises(SimulationTimeout, match=r"limit of 0\.2 s"), deadline(0.2) as armed:
        assert armed
        while True:  # a model that never returns
            pass
    assert time.monotonic() - started < 5
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_fast_block_is_untouched_and_an_outer_timer_survives() -> None:
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        with deadline(10):
            pass
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25 < remaining <= 30  # the caller's timer is back, less the time spent
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not fired


def test_no_limit_off_the_main_thread_or_when_none() -> None:
    with deadline(None) as armed:
        assert not armed
    result: list[bool] = []

    def worker() -> None:
        with deadline(1) as armed:
            result.append(armed)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert result == [False]


@pytest.mark.parametrize("value", [0, -1, float("inf"), "10", True])
def test_bad_limits_are_refused_in_one_line(value: object) -> None:
    with pytest.raises(InputError, match=r"^timeout_s: .*accepted: a positive number of seconds") as caught:
        check_timeout(value)
    assert "\n" not in str(caught.value)


def test_the_cli_default_is_the_simulators() -> None:
    result = CliRunner().invoke(cli, ["simulate", "--help"])
    assert result.exit_code == 0
    assert f"default: {DEFAULT_TIMEOUT_S:g})" in " ".join(result.output.split())


@requires_hf
@pytest.mark.hf
def test_a_simulation_past_its_limit_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sim_cases import TINY, workload

    from vramlens.simulator import SimulationError, simulate, train

    def hang(*args: object, **kwargs: object) -> None:
        while True:
            pass

    monkeypatch.setattr(train, "_micro_step", hang)
    with pytest.raises(
        SimulationError, match=r"^timeout_s: cannot simulate .*limit of 0.5 s.*vramlens estimate"
    ) as caught:
        simulate(workload(TINY["llama"], batch=1, seq=16, precision="bf16"), timeout_s=0.5)
    assert "\n" not in str(caught.value)


def test_your_own_module_past_its_limit_is_a_one_line_error() -> None:
    torch = pytest.importorskip("torch")
    from vramlens.simulator import SimulationError, simulate_module

    def step(model: object, optimizer: object, inputs: object) -> None:
        while True:
            pass

    with pytest.raises(SimulationError, match=r"^timeout_s: cannot simulate step 1 of 1 .*limit of 0.3 s") as caught:
        simulate_module(lambda: torch.nn.Linear(4, 4), step, steps=1, timeout_s=0.3)
    assert "\n" not in str(caught.value)
