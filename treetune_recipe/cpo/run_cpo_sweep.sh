#!/usr/bin/env bash
# Sweep CPO knobs with Hydra multirun: one training job after another, each with its own experiment name.
#   bash run_cpo_sweep.sh                                   # default grid below
#   WRAPS=seq_kl,mi3 NEG_ALPHAS=0.5,1.0 bash run_cpo_sweep.sh trainer.total_epochs=1
set -xeuo pipefail
WRAPS=${WRAPS:-seq_kl,negonly_seq_kl,mi3}
NEG_ALPHAS=${NEG_ALPHAS:-0.5,1.0}
MULTIRUN=1 bash "$(dirname "$0")/run_cpo_qwen3-8b.sh" \
    cpo.method="$WRAPS" \
    cpo.neg_alpha="$NEG_ALPHAS" \
    'trainer.experiment_name=qwen3_8b_cpo_${cpo.method}_neg${cpo.neg_alpha}' \
    "$@"
