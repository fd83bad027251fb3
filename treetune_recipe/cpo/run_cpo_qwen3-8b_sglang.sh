#!/usr/bin/env bash
# Same run as run_cpo_qwen3-8b.sh with SGLang as the rollout server (pip install -e ".[sglang]").
set -xeuo pipefail
ROLLOUT_NAME=sglang EXPERIMENT=${EXPERIMENT:-qwen3_8b_cpo_seq_kl_sglang} \
    bash "$(dirname "$0")/run_cpo_qwen3-8b.sh" "$@"
