#!/usr/bin/env bash
# Slurm template for a tensor-parallel kvbench sweep on 2 nodes x 8 GPUs (issue "Multi-GPU
# workers"): worker groups of --gpus-per-worker GPUs each run one model split over their GPUs
# (heads and MLP columns; NCCL carries the tensors), and rank 0 coordinates and writes the
# database (MPI carries only the control messages). Copy, adjust the #SBATCH lines, then:
#   sbatch scripts/sbatch_tp.sh configs/my_llama8b.yaml results/llama8b.db
#
# Rank layout (srun --distribution=block, 9 tasks per node, 18 ranks):
#   node 0: rank 0 (the coordinator, no GPU), ranks 1..8  = group 0, GPUs 0..7 of node 0
#   node 1: ranks 9..16 = group 1, GPUs 0..7 of node 1;    rank 17 fits no group and idles
# Groups are consecutive ranks from rank 1, so with block distribution a group of 8 stays on one
# node (NVLink). A rank binds the GPU whose index is its rank among the group ranks of its node
# (logged at start as "node-local GPU index"). Rank 17 exists only because Slurm gives every node
# the same task count; it waits for the coordinator's stop and costs nothing but a warning. With
# --ntasks=17 and a hostfile that puts 9 ranks on the first node it disappears.
# Smaller groups: GPUS_PER_WORKER=4 gives 4 groups (ranks 1-4, 5-8 on node 0; 9-12, 13-16 on
# node 1). The degree must divide the model's attention heads, KV heads and FFN size (a
# Llama-3-8B shape, 32 heads / 8 KV heads / FFN 14336, takes 1, 2, 4 or 8); `kvbench validate
# --gpus-per-worker N` checks that and prints the memory per GPU.
# Resume after a failure: submit again with the same database (--resume is passed when it exists).
#
# Device: the groups run on CPU ranks (--device cpu, the default here). Tensor-parallel groups on
# GPUs (NCCL) are refused by the sweep until they have been checked on a machine with two or
# more GPUs; KVB_DEVICE=cuda with GPUS_PER_WORKER > 1 stops here with that message. On GPU nodes,
# run one GPU per worker instead: scripts/sbatch.sh with --device cuda (KVB_DEVICE=cuda with
# GPUS_PER_WORKER=1 also works here).
#SBATCH --job-name=kvbench-tp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=9          # 8 GPU ranks + the coordinator (node 0) / an idle rank (node 1)
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=12:00:00
#SBATCH --output=kvbench-tp-%j.log
set -euo pipefail

config="${1:?usage: sbatch scripts/sbatch_tp.sh CONFIG DB}"
db="${2:?usage: sbatch scripts/sbatch_tp.sh CONFIG DB}"
gpus_per_worker="${GPUS_PER_WORKER:-8}"
root="${KVB_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
bin="${KVB_BIN:-$root/build/kvbench}"
device="${KVB_DEVICE:-cpu}"   # see "Device" above
if [ "$device" = cuda ] && [ "$gpus_per_worker" -gt 1 ]; then
  echo "sbatch_tp.sh: error: KVB_DEVICE=cuda with GPUS_PER_WORKER=$gpus_per_worker: tensor-parallel" \
       "groups run on CPU ranks only (kvbench sweep refuses --device cuda with --gpus-per-worker > 1);" \
       "use KVB_DEVICE=cpu, or GPUS_PER_WORKER=1 (one GPU per worker; scripts/sbatch.sh)" >&2
  exit 2
fi

# Fail fast, before any rank starts: degrees, groups and memory per GPU for 16 worker ranks.
"$bin" validate "$config" --gpus-per-worker "$gpus_per_worker" --ranks 16 >&2

export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
resume=()
[ -f "$db" ] && resume=(--resume)
srun --mpi=pmix --distribution=block "$bin" sweep "$config" --db "$db" "${resume[@]}" \
    --gpus-per-worker "$gpus_per_worker" --device "$device" --progress
