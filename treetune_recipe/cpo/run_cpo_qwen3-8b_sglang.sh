#!/usr/bin/env bash
# Same run as run_cpo_qwen3-8b.sh with SGLang as the rollout server, in the environment of
# `make install-gpu ROLLOUT=sglang` (verl 0.9.1; add VERL=0.7.1 for verl 0.7.1, in .venv-verl0.7.1).
set -xeuo pipefail
ROLLOUT_NAME=sglang EXPERIMENT=${EXPERIMENT:-qwen3_8b_cpo_seq_kl_sglang} \
    bash "$(dirname "$0")/run_cpo_qwen3-8b.sh" "$@"
