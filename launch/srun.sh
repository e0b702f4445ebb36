#!/usr/bin/env bash
# A Slurm batch script: one rank per GPU, NCCL, all nodes of the allocation.
#
#   sbatch --nodes=2 launch/srun.sh 1x2x2x2 yaml/ogbn-products.yaml --set data.prepared=/scratch/products
#
# A CONFIG ending in .py is your own training loop (dgl_scalegnn's API), run on every rank
# as `python SCRIPT.py --grid GRID ...`, as mpirun.sh and torchrun.sh do.
# The process count is nodes x tasks-per-node and must equal the product of the grid.
# Prepare the dataset once (`scalegnn prepare`), on a file system every node reads.
# Rank 0 says which device it trains on and why; add --set parallel.device=cuda to
# refuse to start where CUDA is not usable instead of training on the CPU.
#SBATCH --job-name=scalegnn
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=16
#SBATCH --time=01:00:00
#SBATCH --output=scalegnn-%j.out
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,11p' "$0" >&2
  exit 2
fi
grid=$1 config=$2
shift 2
root=${SCALEGNN_ROOT:-$SLURM_SUBMIT_DIR}

# Rendezvous: the first node of the allocation, where this script runs (ranks read
# SLURM_PROCID/SLURM_NTASKS). Across nodes, as the address this node sends from towards
# the next node: its own name may resolve to a loopback address here (127.0.1.1 in
# Debian's /etc/hosts), where rank 0 would bind the store out of the others' reach.
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
MASTER_ADDR=${nodes[0]}
if [ "${#nodes[@]}" -gt 1 ]; then
  peer=$(getent ahostsv4 "${nodes[1]}" | awk 'NR == 1 {print $1}')
  source=$(ip -o route get "$peer" 2>/dev/null | sed -n 's/.* src \([^ ]*\).*/\1/p')
  MASTER_ADDR=${source:-$MASTER_ADDR}
fi
export MASTER_ADDR
# One port per job, from its id (below the kernel's ephemeral ports, 32768 and up): two
# jobs whose first node is the same would both bind a fixed 29500 ("address already in
# use"). MASTER_PORT, where set, is kept.
export MASTER_PORT=${MASTER_PORT:-$(( 10000 + ${SLURM_JOB_ID:-0} % 20000 ))}
# The ranks keep every rendezvous key under this secret (srun hands it to every task):
# no process outside the job can read or set them. Drawn here unless it is set.
SCALEGNN_JOB_SECRET=${SCALEGNN_JOB_SECRET:-$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')}
export SCALEGNN_JOB_SECRET
# Slurm >= 22.05 no longer hands sbatch's --cpus-per-task to srun: pass it on explicitly.
cpus_per_task=${SLURM_CPUS_PER_TASK:-8}
export OMP_NUM_THREADS=$cpus_per_task

run=("$root/.venv/bin/scalegnn" train --config "$config")
[[ $config == *.py ]] && run=("$root/.venv/bin/python" "$config")  # your own loop

# Usual NCCL settings; adjust the interface to the site's high-speed network.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export NCCL_ASYNC_ERROR_HANDLING=1          # a failed rank aborts the job instead of hanging
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
# export NCCL_SOCKET_IFNAME=hsn0            # e.g. Slingshot; ib0 on InfiniBand
# export NCCL_NET_GDR_LEVEL=PHB             # GPUDirect RDMA where the NIC is close
# export NCCL_CROSS_NIC=1

# Every task sees every GPU of its node (the step has all the job's GPUs; --gpu-bind=none
# keeps Slurm from narrowing CUDA_VISIBLE_DEVICES, as --gpus-per-task=1 would): NCCL finds
# NVLink and peer-to-peer paths only between GPUs a rank sees. Each rank takes GPU
# SLURM_LOCALID itself (its rank on the node), one per rank.
srun --ntasks-per-node="${SLURM_NTASKS_PER_NODE:-4}" --cpus-per-task="$cpus_per_task" \
  --gpu-bind=none \
  "${run[@]}" --grid "$grid" "$@"
