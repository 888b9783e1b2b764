#!/usr/bin/env bash
# Mutation testing with mutmut 3 (pip install mutmut; not a project dependency), run in a scratch
# copy of the tracked files: mutmut writes a mutants/ tree and reads its settings from
# setup.cfg, and neither belongs in the repository.
#
#   experiments/mutation/run_mutmut.sh 'sarathi_lab/metrics.py' tests/test_metrics.py tests/test_engine.py
#   experiments/mutation/run_mutmut.sh 'sarathi_lab/kv/*' tests/test_kv.py tests/test_properties.py
#
# First argument: the files to mutate (a glob, quoted); the rest: the test files to run. Prints
# the tally and every surviving mutant's diff; the scratch copy stays in $MUT_DIR (default
# /tmp/sarathi_mutmut) for `mutmut show` / `mutmut browse`.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 'FILES_TO_MUTATE' TEST_FILE..." >&2; exit 2; }
only=$1; shift
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dir=${MUT_DIR:-/tmp/sarathi_mutmut}
rm -rf "$dir" && mkdir -p "$dir"
git -C "$repo" ls-files -z | (cd "$repo" && tar --null -cf - -T -) | tar -xf - -C "$dir"
{
  echo "[mutmut]"
  echo "source_paths=sarathi_lab/"
  echo "only_mutate=$only"
  echo "pytest_add_cli_args_test_selection=$1"; shift
  for t in "$@"; do echo "    $t"; done
  printf 'pytest_add_cli_args=-p no:cacheprovider\n    -q\n    -x\n'
} > "$dir/setup.cfg"
cd "$dir"
export WANDB_MODE=disabled HF_HUB_OFFLINE=1
mutmut run --max-children "${MUT_JOBS:-2}" > mutmut.log 2>&1 || { tail -c 2000 mutmut.log; exit 1; }
tail -c 200 mutmut.log | tr '\r' '\n' | tail -2
survivors=$(mutmut results 2>/dev/null | awk -F: '/survived/ {print $1}')
echo "survivors: $(echo "$survivors" | grep -c . || true)"
for m in $survivors; do
  echo "=== $m"
  mutmut show "$m" 2>/dev/null | grep -E '^[-+][^-+]' || true
done
