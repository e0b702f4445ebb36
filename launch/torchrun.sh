#!/usr/bin/env bash
# Launch a training job on this node with torchrun (one process per rank).
#
#   launch/torchrun.sh NP GRID CONFIG [scalegnn train options...]
#   launch/torchrun.sh 4 1x1x2x2 yaml/synthetic.yaml --metrics run.jsonl
#   launch/torchrun.sh 4 1x1x2x2 examples/graphsage.py --graph g.bin --out runs/sage
#
# For several nodes, run it on each node with TORCHRUN_ARGS="--nnodes=N --node-rank=I
# --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT" and NP = processes per node, and export
# the same SCALEGNN_JOB_SECRET on every node, e.g. one drawn once with
#   export SCALEGNN_JOB_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
# The ranks keep every rendezvous key under it (no process outside the job can read or
# set them); on one node the script draws a fresh one unless it is set.
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
np=$1 grid=$2 config=$3
shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
torchrun=${TORCHRUN:-$root/.venv/bin/torchrun}
cores=$(nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( cores / np > 0 ? cores / np : 1 ))}
if [ -z "${SCALEGNN_JOB_SECRET:-}" ]; then
  if [[ "${TORCHRUN_ARGS:-}" == *--nnodes* ]]; then
    echo "torchrun.sh: TORCHRUN_ARGS names --nnodes: export the same SCALEGNN_JOB_SECRET" \
      "on every node (see the header of $0)" >&2
    exit 2
  fi
  SCALEGNN_JOB_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
fi
export SCALEGNN_JOB_SECRET
run=(-m dgl_scalegnn.cli train --config "$config")
[[ $config == *.py ]] && run=("$config")  # your own loop: torchrun runs the script
# shellcheck disable=SC2086
exec "$torchrun" --nproc-per-node "$np" ${TORCHRUN_ARGS:---standalone} \
  "${run[@]}" --grid "$grid" "$@"
