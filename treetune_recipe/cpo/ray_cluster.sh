#!/usr/bin/env bash
# Start this node's part of a Ray cluster for a multi-node run (NNODES > 1), then launch the recipe on the head node.
#   on the head node:     bash ray_cluster.sh head                       # prints the RAY_ADDRESS to use
#   on every other node:  RAY_HEAD=<head ip>:6379 bash ray_cluster.sh worker
#   then, on the head:    RAY_ADDRESS=<head ip>:6379 NNODES=2 NGPUS=8 bash run_cpo_qwen3-8b.sh [overrides...]
# Knobs: RAY_PORT (6379, head), NUM_GPUS / NUM_CPUS (default: what Ray detects), RAY_TEMP_DIR (Ray's logs, default
# /tmp/ray), RAY_AUTH_MODE (exported as is: it must be the same on every node and for the launch), DRY_RUN=1 prints
# the ray command instead of running it. Stop a node with `ray stop` on that node (it stops every Ray process there).
set -euo pipefail

role=${1:-}
RAY_PORT=${RAY_PORT:-6379}
launcher=(ray)
[[ "${DRY_RUN:-0}" == 1 ]] && launcher=(printf '%s\n' ray)

node_flags=()
[[ -n "${NUM_GPUS:-}" ]] && node_flags+=("--num-gpus=${NUM_GPUS}")
[[ -n "${NUM_CPUS:-}" ]] && node_flags+=("--num-cpus=${NUM_CPUS}")
[[ -n "${RAY_TEMP_DIR:-}" ]] && node_flags+=("--temp-dir=${RAY_TEMP_DIR}")

case "$role" in
    head)
        "${launcher[@]}" start --head --port="$RAY_PORT" "${node_flags[@]}"
        echo "head started: on the other nodes run RAY_HEAD=$(hostname -I 2>/dev/null | awk '{print $1}'):$RAY_PORT" \
            "bash $0 worker; launch here with RAY_ADDRESS=127.0.0.1:$RAY_PORT" >&2
        ;;
    worker)
        if [[ -z "${RAY_HEAD:-}" ]]; then
            echo "set RAY_HEAD=<head node ip>:<port> (printed by '$0 head' on the head node)" >&2
            exit 1
        fi
        "${launcher[@]}" start --address="$RAY_HEAD" "${node_flags[@]}"
        ;;
    *)
        echo "usage: bash $0 head|worker (see the header of this script)" >&2
        exit 1
        ;;
esac
