#!/usr/bin/env bash
# Slurm template for a kvbench sweep: one MPI rank per GPU (or per CPU socket on CPU nodes) plus
# rank 0, the coordinator that writes the database. Copy, adjust the #SBATCH lines, then:
#   sbatch scripts/sbatch.sh configs/paper_adakv.yaml results/adakv.db
# Resume after a failure (node loss, time limit): submit again with the same database; the
# script passes --resume, which requeues units that were in flight and skips finished ones.
#SBATCH --job-name=kvbench
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=9          # 8 workers (one per GPU) + 1 coordinator on the first node
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=12:00:00
#SBATCH --output=kvbench-%j.log
set -euo pipefail

config="${1:?usage: sbatch scripts/sbatch.sh CONFIG DB}"
db="${2:?usage: sbatch scripts/sbatch.sh CONFIG DB}"
root="${KVB_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
bin="${KVB_BIN:-$root/build/kvbench}"

"$bin" validate "$config" >&2   # fail fast, before any rank starts

export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
resume=()
[ -f "$db" ] && resume=(--resume)
# srun starts the ranks with PMI(x); mpirun works the same where Slurm's MPI plugin is missing:
#   mpirun -np "$SLURM_NTASKS" "$bin" sweep "$config" --db "$db" "${resume[@]}" --progress
srun --mpi=pmix "$bin" sweep "$config" --db "$db" "${resume[@]}" --progress
