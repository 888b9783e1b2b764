#!/usr/bin/env bash
# Every GPU check in one bounded run, for a session lent a GPU (about 5 minutes on an H200):
#   1. Triton kernels against the torch reference at real sizes (bf16, head dims 64/128,
#      block sizes 16/32, contexts to 16k, mixed prefill/decode batches, GQA);
#   2. decode-step time of a ~1.3B random Llama against the memory-bandwidth bound.
# Logs go to $OUT when set (the device tool's result folder), else to the current directory.
#   bash experiments/gpu_check/gpu_check.sh
#   HBM_BW=3.35e12 bash experiments/gpu_check/gpu_check.sh      (H100)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-.}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# the GPU image has torch and triton; install only this package, offline, without dependencies
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$out/gpu_install.log" 2>&1 \
    || { echo "install failed: see $out/gpu_install.log"; exit 1; }
rc=0
timeout 240 python3 experiments/gpu_check/gpu_check.py --only kernels 2>&1 \
    | tee "$out/gpu_check_kernels.log" || rc=1
timeout 240 python3 experiments/gpu_check/gpu_check_executor.py --bandwidth "${HBM_BW:-4.8e12}" 2>&1 \
    | tee "$out/gpu_check_executor.log" || rc=1
echo "gpu checks: $([ $rc = 0 ] && echo PASSED || echo FAILED)"
exit $rc
