#!/usr/bin/env bash
# The budget sweep: Sarathi-Serve at six token budgets and two loads, and vLLM (which has no
# token budget) at the same loads as the reference, each a sweep of its own name (a sweep name
# holds one grid: reusing it for the vLLM grid is refused), reported together:
#   sarathi-lab-report outputs/sweeps/budget_sweep outputs/sweeps/budget_sweep_vllm --out DIR
# Extra arguments go to both sweeps, e.g.
#   experiments/budget_sweep/run.sh resume=true hydra/launcher=parallel
set -euo pipefail
sarathi-lab -m experiment=budget_sweep "$@"
sarathi-lab -m experiment=budget_sweep scheduler=vllm name=budget_sweep_vllm "$@"
