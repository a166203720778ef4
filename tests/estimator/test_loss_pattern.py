"""The loss's requests in code order (``estimate.loss_pattern``) hold the same bytes as the loss's
instants (``estimate.logits``): the two describe one implementation, and this keeps them equal.

For every implementation, the largest live total during the forward script is ``forward_end``,
what the forward leaves alive is ``kept``, and the largest live total during the backward script
(before the head's backward) is ``backward_start``; the logits' gradient is alive at its end.
"""

from __future__ import annotations

import pytest

from vramlens.estimator.logits import logits_memory
from vramlens.estimator.loss_pattern import LossScript, loss_script
from vramlens.workload.options import LossImpl

_T, _V, _H = 1000, 32_000, 2048


def _walk(script: LossScript) -> tuple[int, int, int, set[str]]:
    """(forward peak, live after forward, backward peak, names alive at the end)."""
    live: dict[str, int] = {}

    def run(steps: tuple[tuple[str, str, int], ...]) -> int:
        peak = sum(live.values())
        for op, name, nbytes in steps:
            if op == "+":
                live[name] = nbytes
            else:
                live.pop(name, None)
            peak = max(peak, sum(live.values()))
        return peak

    forward = run(script.forward)
    kept = sum(live.values())
    backward = run(script.backward)
    return forward, kept, backward, set(live)


CASES = [
    pytest.param(LossImpl.FULL, {}, id="full bf16, logits kept in fp32"),
    pytest.param(LossImpl.FULL, {"kept": 0}, id="full bf16, nothing kept"),
    pytest.param(LossImpl.FULL, {"a": 4, "kept": 4}, id="full fp32"),
    pytest.param(LossImpl.FULL, {"softcap": True, "kept": 2}, id="full soft-capped"),
    pytest.param(LossImpl.FULL, {"compiled": True, "kept": 2}, id="compiled"),
    pytest.param(LossImpl.FULL, {"loss_parallel": True, "kept": 0}, id="vocab-parallel"),
    pytest.param(LossImpl.CHUNKED, {"kept": 0}, id="chunked 8"),
]


@pytest.mark.parametrize(("loss", "options"), CASES)
def test_the_script_matches_the_instants(loss: LossImpl, options: dict[str, object]) -> None:
    a = int(options.get("a", 2))  # type: ignore[call-overload]
    kept = int(options.get("kept", 4))  # type: ignore[call-overload]
    flags = {key: bool(options.get(key, False)) for key in ("softcap", "compiled", "loss_parallel")}
    instants = logits_memory(
        loss, tokens=_T, vocab=_V, hidden=_H, logits_bytes=a, keeps_logits=kept > 0, chunks=8,
        kept_bytes=kept or None, **flags,
    )  # fmt: skip
    script = loss_script(loss, tokens=_T, vocab=_V, hidden=_H, logits_bytes=a, kept_bytes=kept, chunks=8, **flags)
    forward, after, backward, alive = _walk(script)
    assert forward == instants.forward_end
    assert after == instants.kept
    assert backward == instants.backward_start
    assert "dlogits" in alive
