#!/usr/bin/env bash
# The budget sweep: Sarathi-Serve at six token budgets and two loads, and vLLM (which has no
# token budget) at the same loads as the reference. Extra arguments go to both sweeps, e.g.
#   experiments/budget_sweep/run.sh resume=true hydra/launcher=parallel
set -euo pipefail
sarathi-lab -m experiment=budget_sweep "$@"
sarathi-lab -m experiment=budget_sweep scheduler=vllm "$@"
