#!/usr/bin/env bash
# Launch a training job on this node with torchrun (one process per rank).
#
#   launch/torchrun.sh NP GRID CONFIG [scalegnn train options...]
#   launch/torchrun.sh 4 1x1x2x2 yaml/synthetic.yaml --metrics run.jsonl
#
# For several nodes, run it on each node with TORCHRUN_ARGS="--nnodes=N --node-rank=I
# --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT" and NP = processes per node.
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
np=$1 grid=$2 config=$3
shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
torchrun=${TORCHRUN:-$root/.venv/bin/torchrun}
cores=$(nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( cores / np > 0 ? cores / np : 1 ))}
# shellcheck disable=SC2086
exec "$torchrun" --nproc-per-node "$np" ${TORCHRUN_ARGS:---standalone} \
  -m dgl_scalegnn.cli train --config "$config" --grid "$grid" "$@"
