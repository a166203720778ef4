"""Framework profiles (``vramlens.resolve.frameworks``) and the loss each one implies.

Checked: every training framework has a profile that cites its source; ``auto`` means
hf and says so; the logits term of ``estimate()`` follows each profile's loss, computed by
hand from the formulas of ``vramlens.estimator.logits`` (module docstring) for
llama-3.2-1b (V = 128,256, h = 2048) at batch 1 x seq 512 = 512 tokens, bf16 logits:

* eager full loss: ``(2 + 4 + 4) V`` per token (transformers ``ForCausalLMLoss``, torchtitan);
* compiled loss (torchtitan ``build_cross_entropy_loss`` compiled with the model):
  ``2V + 4`` per token;
* chunked (torchtune ``CEWithChunkedOutputLoss(num_output_chunks=8)``): ``2V + 4V + 8V/8``;
* fused linear (Megatron profile): ``8h + 2h`` per token.
"""

from __future__ import annotations

import pytest

from vramlens.errors import InputError
from vramlens.estimator import estimate
from vramlens.resolve.frameworks import FRAMEWORKS, profile_for
from vramlens.result.report import MemoryReport
from vramlens.workload.options import Framework, LossImpl

V, H, TOKENS = 128_256, 2048, 512
_TRAINING = [f for f in Framework if f not in (Framework.AUTO, Framework.VLLM)]


def _report(**overrides: object) -> MemoryReport:
    workload: dict[str, object] = {"model": "llama-3.2-1b", "batch": 1, "seq": 512}
    return estimate({**workload, **overrides})


def _logits(report: MemoryReport) -> int:
    return next(term.bytes for term in report.terms if term.name == "logits and loss (at the loss)")


# ---- the registry ------------------------------------------------------------------------------


@pytest.mark.parametrize("framework", _TRAINING)
def test_every_training_framework_has_a_sourced_profile(framework: Framework) -> None:
    profile, note = profile_for(framework)
    assert profile is FRAMEWORKS[framework]
    assert profile.name is framework
    assert note is None
    assert profile.source.strip() and profile.description.strip()
    assert profile.chunked_loss_chunks >= 1


def test_vllm_is_an_inference_engine_without_a_training_profile() -> None:
    # The profiles describe training stacks only; vllm is refused with the accepted list.
    assert set(FRAMEWORKS) == set(_TRAINING)
    with pytest.raises(InputError, match="no training profile"):
        profile_for(Framework.VLLM)


def test_auto_means_hf_with_an_assumption() -> None:
    profile, note = profile_for(Framework.AUTO)
    assert profile is FRAMEWORKS[Framework.HF]
    assert note is not None and "framework auto" in note and "hf" in note


def test_estimate_reports_the_framework_auto_assumption() -> None:
    assert any("framework auto" in line for line in _report(framework="auto").assumptions)
    assert not any("framework auto" in line for line in _report(framework="hf").assumptions)


# ---- the loss each framework implies --------------------------------------------------------


def test_hf_default_is_the_eager_full_loss() -> None:
    # bf16 logits 2V + fp32 copy 4V + log-probs 4V per token.
    assert _logits(_report(framework="hf")) == TOKENS * (2 + 4 + 4) * V  # 656,670,720 B


def test_torchtitan_compile_compiles_the_loss() -> None:
    compiled = _report(framework="torchtitan", compile=True)
    eager = _report(framework="torchtitan", compile=False)
    # Inductor: bf16 logits plus one fp32 log-sum-exp per token.
    assert _logits(compiled) == TOKENS * (2 * V + 4) == 131_336_192
    assert _logits(eager) == TOKENS * 10 * V == 656_670_720
    assert _logits(compiled) < _logits(eager)
    assert any("compiles the loss" in line for line in compiled.assumptions)
    assert not any("compiles the loss" in line for line in eager.assumptions)


def test_explicit_full_loss_stays_eager_under_compile() -> None:
    report = _report(framework="torchtitan", compile=True, loss="full")
    assert _logits(report) == TOKENS * 10 * V
    assert not any("compiles the loss" in line for line in report.assumptions)


def test_frameworks_without_a_compiled_loss_ignore_compile() -> None:
    # hf's profile does not compile its loss (compiles_loss=False): compile changes nothing here.
    assert _logits(_report(framework="hf", compile=True)) == TOKENS * 10 * V


def test_megatron_defaults_to_fused_linear_loss() -> None:
    report = _report(framework="megatron")
    assert FRAMEWORKS[Framework.MEGATRON].loss is LossImpl.FUSED_LINEAR
    # 8h of fp32 logits + gradient (one chunk) and the bf16 input gradient 2h, per token.
    assert _logits(report) == TOKENS * (8 * H + 2 * H) == 10_485_760
    assert any("loss auto: fused-linear" in line for line in report.assumptions)


def test_torchtune_defaults_to_chunked_loss_with_eight_chunks() -> None:
    report = _report(framework="torchtune")
    assert FRAMEWORKS[Framework.TORCHTUNE].loss is LossImpl.CHUNKED
    # bf16 logits 2V + kept log-probs 4V + the last of 8 chunks' fp32 up-cast 4V/8.
    assert _logits(report) == TOKENS * (2 * V + 4 * V + 4 * V // 8) == 426_835_968
    assert any("loss auto: chunked" in line for line in report.assumptions)


def test_torchtune_compile_keeps_its_chunked_loss() -> None:
    # torchtune's loss auto is chunked; the dispatch keeps the chunked formula under compile.
    assert _logits(_report(framework="torchtune", compile=True)) == TOKENS * (2 * V + 4 * V + 4 * V // 8)


def test_litgpt_chunks_are_128_tokens() -> None:
    # LitGPT's head and loss work on chunks of 128 sequence positions (lm_head_chunk_size=128):
    # a 512-token sequence makes 4 chunks. Checked on the chunk count the term states.
    chunks = 512 // 128
    term = next(t for t in _report(framework="litgpt").terms if t.name == "logits and loss (at the loss)")
    assert f"({chunks} chunks)" in term.formula


def test_explicit_loss_overrides_the_profile() -> None:
    assert _logits(_report(framework="megatron", loss="full")) == TOKENS * 10 * V
    assert _logits(_report(framework="hf", loss="fused-linear")) == TOKENS * 10 * H


def test_torchtune_per_layer_compile_still_frees_gradients_layer_by_layer() -> None:
    """torchtune's ``training.compile_model`` compiles each transformer layer on its own, so with
    ``optimizer_in_backward`` each layer's gradients are stepped and freed as they come even under
    compile (no optimizer_step phase); a whole-model compile (hf) returns them all at once."""
    from vramlens.estimator import estimate

    workload = {"model": "llama-3.2-1b", "batch": 1, "seq": 512, "optimizer_in_backward": True, "compile": True}
    tune = estimate({**workload, "framework": "torchtune", "precision": "bf16"})
    hf = estimate({**workload, "framework": "hf", "precision": "bf16"})
    assert [p.name for p in tune.phases] == ["forward", "backward"]
    assert [p.name for p in hf.phases] == ["forward", "backward", "optimizer_step"]
    assert any("compiles each layer on its own" in note for note in tune.assumptions)
    assert FRAMEWORKS[Framework.TORCHTUNE].compiles_per_layer and not FRAMEWORKS[Framework.HF].compiles_per_layer
