#!/usr/bin/env bash
# The README's main job: sets up (system packages, models), builds kvbench and runs the quickstart
# sweep (configs/quickstart.yaml: NIAH on SmolLM2-135M-Instruct, six policies x two budgets) in
# one process, writing out/quickstart.db and printing the summary table. A second run finds every
# unit finished and only prints the table; delete the database to start over.
# Under MPI instead: mpirun --bind-to none -np 3 build/kvbench sweep configs/quickstart.yaml --db out/quickstart.db
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
bash scripts/fetch_models.sh
build="${KVB_BUILD_DIR:-build}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target kvbench
mkdir -p out
"$build/kvbench" validate configs/quickstart.yaml | grep -E '^units:|^- time:' >&2 || true
"$build/kvbench" sweep configs/quickstart.yaml --db out/quickstart.db --progress
"$build/kvbench" report --db out/quickstart.db --out out/quickstart-report
echo "quickstart: report in out/quickstart-report/index.html (and report.md, csv/, plots/)" >&2
