#!/usr/bin/env bash
# The priorities study in one command: the sweep (configs/experiment/priorities.yaml), then its table and
# figures in results/priorities/. Extra arguments go to the sweep, e.g.
#   experiments/priorities/run.sh resume=true hydra/launcher=parallel
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
sweeps=${SWEEPS:-outputs/sweeps}   # set SWEEPS=DIR/sweeps when passing results_root=DIR
sarathi-lab -m experiment=priorities "$@"
python "$root/experiments/priorities/analyze.py" "$sweeps/priorities" "$root/results/priorities"
