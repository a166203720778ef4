"""Framework profiles: the implementation choices that differ between training stacks.

``framework: auto`` picks ``hf`` for training and says so. Each profile documents
where its defaults come from; the estimator reads them wherever the workload
says ``auto``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vramlens._compat import StrEnum
from vramlens.errors import InputError
from vramlens.resolve.styles import HfStyle, hf_style, litgpt_style, torchtune_style
from vramlens.workload.options import AttentionImpl, Framework, FsdpWrap, LossImpl, OptimizerImpl

__all__ = ["FRAMEWORKS", "PLAIN_NOTE", "FrameworkProfile", "MixedStyle", "NormImpl", "layer_style", "profile_for"]

#: What the plain profile assumes, for the report (its precision is the workload's, not the loop's).
PLAIN_NOTE = (
    "framework plain: torch.optim.AdamW without fused= (foreach), full logits, nothing fused; mixed precision "
    "means the loop runs its forward under torch.autocast (a loop without it trains in the weights' dtype: "
    "--precision fp32 or bf16)"
)


class NormImpl(StrEnum):
    """How a norm layer keeps tensors for backward."""

    HF_EAGER = "hf-eager"
    """transformers' RMSNorm: an fp32 copy of the input, the rsqrt, and the normalized tensor are saved."""
    FUSED = "fused"
    """A fused/compiled norm: the input and one fp32 statistic per token are saved."""


class MixedStyle(StrEnum):
    """What ``mixed-bf16``/``mixed-fp16`` means in a framework."""

    AUTOCAST = "autocast"
    """fp32 parameters, grads and states; torch.autocast casts each weight to bf16 in the
    forward, and the cast is kept until that layer's backward (HF Trainer, Lightning)."""
    FSDP_PARAM_DTYPE = "fsdp-param-dtype"
    """FSDP2 MixedPrecisionPolicy: fp32 sharded parameters/grads/states, bf16 parameters
    all-gathered per layer for compute (torchtitan)."""
    MASTER_WEIGHTS = "master-weights"
    """bf16 parameters and gradients; fp32 master weights and states inside the optimizer,
    partitioned by ZeRO / the distributed optimizer (DeepSpeed, Megatron)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FrameworkProfile:
    """Defaults of one training stack."""

    name: Framework
    description: str
    optimizer_impl: OptimizerImpl
    """What ``optimizer_impl: auto`` means for AdamW."""
    attention: AttentionImpl
    """What ``attention: auto`` means."""
    loss: LossImpl
    """What ``loss: auto`` means."""
    chunked_loss_chunks: int
    """Chunks of the chunked cross-entropy when the loss is chunked (``loss: chunked`` on a
    framework without one of its own: 8, torchtune's default)."""
    norm: NormImpl
    mixed: MixedStyle
    chunked_loss_positions: int | None = None
    """Sequence positions per loss chunk where a framework chunks by length instead of by
    count (LitGPT's ``lm_head_chunk_size=128``): chunks = seq / this."""
    compiles_loss: bool
    """With ``compile: true`` and ``loss: auto``, torch.compile covers the cross-entropy too."""
    keeps_logits: bool
    """The model returns the full logits, which stay alive through the backward pass (HF ``outputs.logits``).

    For ``hf`` this is the training loop ``out = model(**batch); out.loss.backward()`` of PEFT's
    and accelerate's examples. HF Trainer's ``compute_loss`` returns the loss alone, so its
    outputs die before backward (``b*s*V*a`` bytes less); the published Trainer measurements
    (Liger-Kernel's e2e runs) still sit at or above the estimate with the logits kept, so the
    profile keeps them, which never under-estimates either loop (benchmarks/accuracy.py:
    dropping them puts 9.4% of points more than 10% under, against the 5% target)."""
    adapters_fp32: bool
    """LoRA adapters are kept in fp32 whatever the base dtype (PEFT ``autocast_adapter_dtype``)."""
    fsdp_wrap: FsdpWrap = FsdpWrap.ROOT
    """FSDP's units under ``fsdp_wrap: auto`` (:mod:`vramlens.estimator.fsdp`)."""
    fsdp2: bool = False
    """The framework's FSDP is always FSDP2 (``fully_shard``), whatever its units: torchtitan
    (``apply_fsdp``), torchtune (``training.shard_model``). Else FSDP2 with the ``split`` wrapping
    (transformers 5 Trainer) and FSDP1 with ``root``. Decides the streams of the gathered
    parameters (:mod:`vramlens.allocator.streams`)."""
    fsdp2_lora: bool = False
    """A LoRA run shards with FSDP2: ``fully_shard`` per decoder layer and then on the model with
    ``reshard_after_forward`` left to its default, which keeps the root unit (embedding, final norm,
    head) gathered from forward to the end of backward (:func:`vramlens.estimator.fsdp.fsdp2_root_unsharded`;
    litgpt ``finetune/lora.py`` ``parallelize_fn`` under Fabric's ``ModelParallelStrategy``); its full
    fine-tunes shard with FSDP1 (litgpt ``finetune/full.py``, ``adapter.py``, ``pretrain.py``: Lightning's
    ``FSDPStrategy(auto_wrap_policy={Block})``)."""
    fsdp_reduce_fp32: bool = False
    """FSDP reduce-scatters gradients in fp32 (torchtitan's ``mixed_precision_reduce``); else in the
    all-gathered parameters' dtype (accelerate: ``reduce_dtype`` = ``param_dtype``)."""
    loss_in_model: bool = False
    """The loss runs inside the model's forward (HF: labels passed to the model), so FSDP2's root
    post-forward, which frees the last all-gather buffer, comes after it."""
    compiles_per_layer: bool = False
    """``compile: true`` compiles each decoder layer on its own (torchtune ``training.compile_model``:
    ``layer.compile()`` per transformer layer), so the backward still runs layer by layer and an
    optimizer in backward frees each layer's gradients as they come; a whole-model compile returns
    every gradient at once."""
    own_modules: Callable[[HfStyle], HfStyle] | None = None
    """The framework builds its decoders from its own modules, not transformers' classes: how
    their layers keep tensors, given the family's transformers style (torchtune:
    :func:`vramlens.resolve.styles.torchtune_style`). None: transformers' modules."""
    kbit_prepare: bool = False
    """QLoRA on a bitsandbytes 4-bit base runs ``peft.prepare_model_for_kbit_training``, which
    casts every fp16/bf16 weight that is not 4-bit (embeddings, norms, LM head, biases) to fp32
    (:mod:`vramlens.estimator.qlora`; sharded QLoRA skips it)."""
    outputs_fp32: bool = False
    """The framework hands the loop the model's outputs in fp32 whatever the precision: Lightning
    Fabric's precision plugins (``HalfPrecision``/``MixedPrecision.convert_output`` cast every
    floating output to ``torch.get_default_dtype()``, lightning/fabric/plugins/precision/half.py),
    so the loss reads fp32 logits (:mod:`vramlens.estimator.loss_outputs`)."""
    bnb_embeddings_32bit: bool = False
    """Under a bitsandbytes 8-bit optimizer, ``nn.Embedding`` weights keep 32-bit state (two fp32
    moments): transformers' ``Trainer.create_optimizer`` registers ``{"optim_bits": 32}`` for each
    (:mod:`vramlens.estimator.paged`)."""
    source: str


FRAMEWORKS: dict[Framework, FrameworkProfile] = {
    Framework.HF: FrameworkProfile(
        name=Framework.HF,
        description="transformers + Trainer/accelerate (+ PEFT): eager modules, SDPA, fp32-upcast loss",
        optimizer_impl=OptimizerImpl.FUSED,
        attention=AttentionImpl.SDPA,
        loss=LossImpl.FULL,
        chunked_loss_chunks=8,
        norm=NormImpl.HF_EAGER,
        mixed=MixedStyle.AUTOCAST,
        compiles_loss=False,
        keeps_logits=True,
        adapters_fp32=True,
        fsdp_wrap=FsdpWrap.SPLIT,
        loss_in_model=True,
        kbit_prepare=True,
        bnb_embeddings_32bit=True,
        source="transformers 5.x TrainingArguments.optim default 'adamw_torch_fused' (torch>=2.8); "
        "ForCausalLMLoss upcasts logits to fp32; LlamaRMSNorm computes in fp32; PEFT autocast_adapter_dtype=True; "
        "FSDP: fsdp_config version 2 by default (TrainingArguments), accelerate 1.15 fsdp2_prepare_model units; "
        "QLoRA: peft.prepare_model_for_kbit_training as in PEFT's and transformers' QLoRA guides, the QLoRA "
        "paper's qlora.py and TRL's SFTTrainer up to 0.26 (not under FSDP/ZeRO-3; TRL 0.27+ skips it); "
        "bitsandbytes 8-bit optimizers: Trainer.create_optimizer gives nn.Embedding weights 32-bit state",
    ),
    Framework.TRL: FrameworkProfile(
        name=Framework.TRL,
        description="TRL SFTTrainer/DPOTrainer: transformers' Trainer with TRL's fused LM head (chunked log-probs)",
        optimizer_impl=OptimizerImpl.FUSED,
        attention=AttentionImpl.SDPA,
        loss=LossImpl.CHUNKED_LOGPROB,
        chunked_loss_chunks=8,
        norm=NormImpl.HF_EAGER,
        mixed=MixedStyle.AUTOCAST,
        compiles_loss=False,
        keeps_logits=False,
        adapters_fp32=True,
        fsdp_wrap=FsdpWrap.SPLIT,
        loss_in_model=True,
        kbit_prepare=False,
        bnb_embeddings_32bit=True,
        source="TRL 1.16: SFTTrainer and DPOTrainer call add_fused_lm_head (trl/trainer/utils.py), so the loss "
        "is -log_probs from ChunkedLogProbFunction (trl/kernels/chunked_logprob.py; 4096 x 32768 tiles, the "
        "entropy and is_top1 metrics computed in the same pass; use_liger_kernel no longer fuses the loss) and "
        "no logits are returned or kept; Trainer's adamw_torch_fused; SFTConfig/DPOConfig default "
        "gradient_checkpointing=True and bf16=True (the workload says recompute and precision); PEFT "
        "autocast_adapter_dtype; no prepare_model_for_kbit_training since TRL 0.27",
    ),
    Framework.PLAIN: FrameworkProfile(
        name=Framework.PLAIN,
        description="a hand-written PyTorch loop over a transformers model: torch defaults, nothing fused",
        optimizer_impl=OptimizerImpl.FOREACH,
        attention=AttentionImpl.SDPA,
        loss=LossImpl.FULL,
        chunked_loss_chunks=8,
        norm=NormImpl.HF_EAGER,
        mixed=MixedStyle.AUTOCAST,
        compiles_loss=False,
        keeps_logits=False,
        adapters_fp32=True,
        fsdp_wrap=FsdpWrap.ROOT,
        loss_in_model=False,
        kbit_prepare=False,
        source="seed 002's loop: model = AutoModelForCausalLM.from_pretrained(...); optimizer = "
        "torch.optim.AdamW(model.parameters()) (no fused=: torch picks the foreach kernels on CUDA, "
        "torch.optim.optimizer._default_to_fused_or_foreach); loss = f(model(inputs).logits); loss.backward(); "
        "optimizer.step(). transformers' default SDPA attention and fp32-computing RMSNorm; full logits, the "
        "loss outside the model and nothing keeping the outputs object, so the logits die after the loss "
        "(a loop that keeps `outputs` through backward is framework hf); PEFT adapters fp32 "
        "(autocast_adapter_dtype); no prepare_model_for_kbit_training unless the loop calls it; FSDP wrapped "
        "per decoder layer with the root left alone",
    ),
    Framework.TORCHTITAN: FrameworkProfile(
        name=Framework.TORCHTITAN,
        description="torchtitan: FSDP2 mixed precision (bf16 params, fp32 reduce), fused AdamW, flash SDPA",
        optimizer_impl=OptimizerImpl.FUSED,
        attention=AttentionImpl.FLASH,
        loss=LossImpl.FULL,
        chunked_loss_chunks=8,
        norm=NormImpl.FUSED,
        mixed=MixedStyle.FSDP_PARAM_DTYPE,
        compiles_loss=True,
        keeps_logits=False,
        adapters_fp32=False,
        fsdp_wrap=FsdpWrap.SPLIT,
        fsdp2=True,
        fsdp_reduce_fp32=True,
        source="torchtitan train configs: optimizer.implementation 'fused', mixed_precision_param bf16 / reduce fp32, "
        "cross_entropy on logits.float(), compiled with the model when training.compile is set "
        "(components/loss.py build_cross_entropy_loss, since 2025-04-02); FSDP units of "
        "models/llama3/infra/parallelize.py apply_fsdp (tok_embeddings, layers, [norm, output]; since 2025-07-28)",
    ),
    Framework.TORCHTUNE: FrameworkProfile(
        name=Framework.TORCHTUNE,
        description="torchtune: bf16 training, chunked cross-entropy (8 chunks), fused AdamW in configs",
        optimizer_impl=OptimizerImpl.FUSED,
        attention=AttentionImpl.SDPA,
        loss=LossImpl.CHUNKED,
        chunked_loss_chunks=8,
        norm=NormImpl.HF_EAGER,
        mixed=MixedStyle.AUTOCAST,
        compiles_loss=True,
        keeps_logits=False,
        adapters_fp32=False,
        compiles_per_layer=True,
        fsdp2=True,
        own_modules=torchtune_style,
        source="torchtune CEWithChunkedOutputLoss(num_output_chunks=8); recipes' AdamW fused=True; "
        "training.compile_model compiles each transformer layer separately (torchtune/training/_compile.py); "
        "torchtune.modules layers: RMSNorm as F.rms_norm on x.float(), GQA keys/values expanded to every head, "
        "an fp32 rope_cache buffer (torchtune 0.6.1, checked by tests/estimator/test_trainer_torchtune.py)",
    ),
    Framework.LITGPT: FrameworkProfile(
        name=Framework.LITGPT,
        description="LitGPT: Lightning Fabric, chunked cross-entropy, RMSNorm in fp32",
        optimizer_impl=OptimizerImpl.FOREACH,
        attention=AttentionImpl.SDPA,
        loss=LossImpl.CHUNKED,
        chunked_loss_chunks=16,
        norm=NormImpl.HF_EAGER,
        mixed=MixedStyle.AUTOCAST,
        chunked_loss_positions=128,
        compiles_loss=False,
        keeps_logits=True,
        outputs_fp32=True,
        adapters_fp32=False,
        own_modules=litgpt_style,
        fsdp2_lora=True,
        source="litgpt finetune scripts: model(..., lm_head_chunk_size=128) and utils.chunked_cross_entropy over "
        "those 128-position chunks; the fit loop's `logits` list stays alive through fabric.backward(loss) "
        "(litgpt/finetune/lora.py fit); Fabric's precision plugin returns the outputs in fp32 "
        "(HalfPrecision.convert_output); torch AdamW defaults to foreach on CUDA; litgpt's own GPT modules "
        "(fused qkv, GQA keys/values repeat_interleave'd, LoRAQKVLinear's zero_pad; litgpt 0.5.13, checked by "
        "tests/estimator/test_litgpt.py); FSDP: finetune/lora.py's ModelParallelStrategy(parallelize_fn) is FSDP2 "
        "fully_shard per checkpoint-wrapped Block and on the root (kept gathered), finetune/full.py, adapter.py and "
        "pretrain.py Lightning's FSDPStrategy(auto_wrap_policy={Block}) (FSDP1, the root wrapping)",
    ),
    Framework.MEGATRON: FrameworkProfile(
        name=Framework.MEGATRON,
        description="Megatron-LM: distributed optimizer with fp32 master weights, fused kernels, vocab-parallel loss",
        optimizer_impl=OptimizerImpl.FUSED,
        attention=AttentionImpl.FLASH,
        loss=LossImpl.FUSED_LINEAR,
        chunked_loss_chunks=8,
        norm=NormImpl.FUSED,
        mixed=MixedStyle.MASTER_WEIGHTS,
        compiles_loss=False,
        keeps_logits=False,
        adapters_fp32=False,
        source="Megatron-LM: Apex/TE FusedAdam, fp32 main params and grads in the distributed optimizer, "
        "vocab_parallel_cross_entropy on bf16 logits",
    ),
    Framework.DEEPSPEED: FrameworkProfile(
        name=Framework.DEEPSPEED,
        description="DeepSpeed ZeRO with HF models: bf16 params/grads, fp32 master + states partitioned, FusedAdam",
        optimizer_impl=OptimizerImpl.FUSED,
        attention=AttentionImpl.SDPA,
        loss=LossImpl.FULL,
        chunked_loss_chunks=8,
        norm=NormImpl.HF_EAGER,
        mixed=MixedStyle.MASTER_WEIGHTS,
        compiles_loss=False,
        keeps_logits=True,
        adapters_fp32=True,
        source="DeepSpeed ZeRO: 2 bytes params + (2 bf16 grads + 4 fp32 grads + 12 optimizer) / N (DeepSpeed memory docs); "
        "its bucket and ZeRO-3 coordinator sizes as HF's example configs ask for them (resolve/zero.py); ZeRO-3 "
        "gathers by its PartitionedParameterCoordinator's rules (estimator/zero3.py, deepspeed 0.19.8)",
    ),
}


def layer_style(model_type: str, profile: FrameworkProfile) -> HfStyle:
    """How ``model_type``'s decoder layers keep tensors under ``profile`` (its own modules, or transformers')."""
    style = hf_style(model_type)
    return style if profile.own_modules is None else profile.own_modules(style)


def profile_for(framework: Framework) -> tuple[FrameworkProfile, str | None]:
    """The profile for ``framework``; ``auto`` means hf, returned with an assumption to report."""
    if framework is Framework.AUTO:
        return FRAMEWORKS[Framework.HF], "framework auto: using the hf profile (transformers + Trainer + PEFT)"

    if framework not in FRAMEWORKS:
        accepted = ", ".join(f.value for f in FRAMEWORKS)
        raise InputError(f"framework: {framework} has no training profile; expected one of auto, {accepted}")
    return FRAMEWORKS[framework], None
