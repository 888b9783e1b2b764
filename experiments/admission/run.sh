#!/usr/bin/env bash
# The admission study in one command: the sweep (configs/experiment/admission.yaml), then its table and
# figures in results/admission/. Extra arguments go to the sweep, e.g.
#   experiments/admission/run.sh resume=true hydra/launcher=parallel
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
sweeps=${SWEEPS:-outputs/sweeps}   # set SWEEPS=DIR/sweeps when passing results_root=DIR
sarathi-lab -m experiment=admission "$@"
python "$root/experiments/admission/analyze.py" "$sweeps/admission" "$root/results/admission"
