#!/usr/bin/env bash
# Mutation testing with mutmut 3 (pip install mutmut; not a project dependency), run in a scratch
# copy of the tracked files: mutmut writes a mutants/ tree and reads its settings from
# setup.cfg, and neither belongs in the repository.
#
#   experiments/mutation/run_mutmut.sh 'sarathi_lab/metrics.py' tests/test_metrics.py tests/test_engine.py
#   experiments/mutation/run_mutmut.sh 'sarathi_lab/kv/*' tests/test_kv.py tests/test_properties.py
#
#   experiments/mutation/run_mutmut.sh 'sarathi_lab/engine/core.py sarathi_lab/schedulers/*' tests/test_engine.py
#
# First argument: the files to mutate (globs, quoted, separated by spaces); the rest: the test
# files to run. Prints the tally, the mutants and survivors of each module, and every surviving
# mutant's diff; the scratch copy stays in $MUT_DIR (default /tmp/sarathi_mutmut) for
# `mutmut show` / `mutmut browse`. $MUT_DESELECT: test ids to leave out (space-separated), e.g. a
# test that runs the CLI in a subprocess from another directory, where the mutated code cannot
# find mutmut's settings. $MUT_ONLY: a file of mutant names (one a line, as printed after ===):
# test only those, e.g. the survivors of an earlier run against new tests.
set -euo pipefail
shopt -u nullglob; set -f   # the globs are mutmut's to expand, not the shell's
[ $# -ge 2 ] || { echo "usage: $0 'FILES_TO_MUTATE' TEST_FILE..." >&2; exit 2; }
only=$1; shift
names=()
[ -z "${MUT_ONLY:-}" ] || mapfile -t names < "$MUT_ONLY"
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dir=${MUT_DIR:-/tmp/sarathi_mutmut}
rm -rf "$dir" && mkdir -p "$dir"
git -C "$repo" ls-files -z | (cd "$repo" && tar --null -cf - -T -) | tar -xf - -C "$dir"
{
  echo "[mutmut]"
  echo "source_paths=sarathi_lab/"
  printf 'also_copy=configs/\n    kernels/\n'   # tests read the config files beside tests/
  echo "only_mutate="
  for g in $only; do echo "    $g"; done
  echo "pytest_add_cli_args_test_selection=$1"; shift
  for t in "$@"; do echo "    $t"; done
  printf 'pytest_add_cli_args=-p no:cacheprovider\n    -q\n    -x\n'
  for t in ${MUT_DESELECT:-}; do echo "    --deselect=$t"; done
  # a mutant that loops forever is stopped after this many times the tests' own run time
  # (mutmut's default, 15, lets each one hold a core for ten minutes)
  echo "timeout_multiplier=${MUT_TIMEOUT_X:-3}"
} > "$dir/setup.cfg"
cd "$dir"
export WANDB_MODE=disabled HF_HUB_OFFLINE=1
mutmut run --max-children "${MUT_JOBS:-2}" "${names[@]}" > mutmut.log 2>&1 || { tail -c 2000 mutmut.log; exit 1; }
tail -c 200 mutmut.log | tr '\r' '\n' | tail -2
mutmut results --all true 2>/dev/null > results.txt || true
# per module: mutants, survivors (a mutant's name is module.function__mutmut_N)
awk -F: 'NF > 1 {sub(/^ +/, "", $1); split($1, a, ".x"); m = a[1]; n[m]++; if ($2 ~ /survived/) s[m]++}
         END {for (m in n) printf "  %-40s %5d mutants %4d survived\n", m, n[m], s[m]}' results.txt | sort
survivors=$(awk -F: '/survived/ {sub(/^ +/, "", $1); print $1}' results.txt)
echo "survivors: $(echo "$survivors" | grep -c . || true)"
for m in $survivors; do
  echo "=== $m"
  mutmut show "$m" 2>/dev/null | grep -E '^[-+][^-+]' || true
done
