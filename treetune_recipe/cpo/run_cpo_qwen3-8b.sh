#!/usr/bin/env bash
# CPO on Qwen3-8B, one node with 8x H100 (80 GB), vLLM async rollout.
# Hyperparameters: the reference's seq_kl main run (spec section 7.2) adapted to 8B.
#   MODEL_PATH=/models/Qwen3-8B DATA_DIR=/data/cpo CKPT_DIR=/ckpt/cpo bash run_cpo_qwen3-8b.sh [hydra overrides...]
#   DRY_RUN=1 ... prints the full command instead of running it.
# Several nodes: start a Ray cluster first (ray_cluster.sh), then on the head node
#   RAY_ADDRESS=<head ip>:6379 NNODES=2 NGPUS=8 bash run_cpo_qwen3-8b.sh    (MODEL_PATH, DATA_DIR, CKPT_DIR shared)
# DATA_DIR holds the parquet files written by treetune_scripts/data/prepare_*.py.
set -xeuo pipefail

MODEL_PATH=${MODEL_PATH:-$HOME/models/Qwen3-8B}
DATA_DIR=${DATA_DIR:-$HOME/data/cpo}
export CKPT_DIR=${CKPT_DIR:-$HOME/checkpoints/cpo}
ROLLOUT_NAME=${ROLLOUT_NAME:-vllm}
NGPUS=${NGPUS:-8}
NNODES=${NNODES:-1}
ENABLE_THINKING=${ENABLE_THINKING:-False}
EXPERIMENT=${EXPERIMENT:-qwen3_8b_cpo_seq_kl}

train_files="['${DATA_DIR}/math_train.parquet']"
val_files="['${DATA_DIR}/math500.parquet','${DATA_DIR}/aime2024.parquet','${DATA_DIR}/aime2025.parquet','${DATA_DIR}/amc23.parquet','${DATA_DIR}/gpqa.parquet']"

missing=()
[[ -d "$MODEL_PATH" ]] || missing+=("model directory MODEL_PATH=$MODEL_PATH")
for f in math_train math500 aime2024 aime2025 amc23 gpqa; do
    [[ -f "$DATA_DIR/$f.parquet" ]] || missing+=("data file $DATA_DIR/$f.parquet (see treetune_scripts/data/)")
done
if (( NNODES > 1 )) && [[ -z "${RAY_ADDRESS:-}" ]]; then
    missing+=("RAY_ADDRESS of a running Ray cluster for NNODES=$NNODES (start it with treetune_recipe/cpo/ray_cluster.sh)")
fi
if (( ${#missing[@]} )); then
    printf 'missing: %s\n' "${missing[@]}" >&2
    exit 1
fi

# MULTIRUN=1 turns the overrides into a Hydra sweep (see run_cpo_sweep.sh); --multirun must precede them.
hydra_flags=()
[[ "${MULTIRUN:-0}" == 1 ]] && hydra_flags+=(--multirun)
# DRY_RUN=1 prints the command, one argument per line, instead of running it.
launcher=(python3)
[[ "${DRY_RUN:-0}" == 1 ]] && launcher=(printf '%s\n' python3)

"${launcher[@]}" -m treetune_recipe.cpo.main_cpo "${hydra_flags[@]}" \
    data.train_files="$train_files" \
    data.val_files="$val_files" \
    data.train_batch_size=1024 \
    data.max_prompt_length=2048 \
    data.max_response_length=16384 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    +data.apply_chat_template_kwargs.enable_thinking=${ENABLE_THINKING} \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20000 \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    actor_rollout_ref.rollout.name="$ROLLOUT_NAME" \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.max_num_batched_tokens=20000 \
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=20000 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.val_kwargs.temperature=0.6 \
    actor_rollout_ref.rollout.val_kwargs.top_p=0.95 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=True \
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=20000 \
    cpo.method=seq_kl \
    cpo.cpo_lambda=2.0 \
    cpo.pos_alpha=0.0 \
    cpo.neg_alpha=1.0 \
    cpo.loss_position=all \
    trainer.logger='[console,wandb]' \
    trainer.project_name=treetune_cpo \
    trainer.experiment_name="$EXPERIMENT" \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.nnodes="$NNODES" \
    trainer.save_freq=7 \
    trainer.test_freq=7 \
    trainer.total_epochs=20 \
    'trainer.default_local_dir=${oc.env:CKPT_DIR}/${trainer.experiment_name}' \
    trainer.resume_mode=auto \
    "$@"
