#!/usr/bin/env bash
# The fairness study in one command: the sweep (configs/experiment/fairness.yaml), then its table and
# figures in results/fairness/. Extra arguments go to the sweep, e.g.
#   experiments/fairness/run.sh resume=true hydra/launcher=parallel
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
sweeps=${SWEEPS:-outputs/sweeps}   # set SWEEPS=DIR/sweeps when passing results_root=DIR
sarathi-lab -m experiment=fairness "$@"
python "$root/experiments/fairness/analyze.py" "$sweeps/fairness" "$root/results/fairness"
