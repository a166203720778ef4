# TRL SFT with LoRA on two GPUs (as in TRL's SFT docs), with expandable segments
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True accelerate launch --num_processes 2 \
  trl/scripts/sft.py \
  --model_name_or_path Qwen/Qwen2.5-7B \
  --dataset_name trl-lib/Capybara \
  --learning_rate 2.0e-4 \
  --num_train_epochs 1 \
  --packing \
  --per_device_train_batch_size 4 \
  --gradient_accumulation_steps 4 \
  --gradient_checkpointing \
  --max_length 2048 \
  --optim adamw_torch_fused \
  --bf16 \
  --dtype bfloat16 \
  --use_peft \
  --lora_r 32 \
  --lora_alpha 16 \
  --lora_target_modules all-linear \
  --eval_strategy steps \
  --eval_steps 100 \
  --output_dir Qwen2.5-7B-SFT-LoRA
