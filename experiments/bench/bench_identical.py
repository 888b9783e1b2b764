"""Same results from two installs: the bench's `sarathi-lab` commands run under each, and their
run directories compared.

The setting is bench_cli_compare.py's (10,000 Azure conversation requests at 1 QPS,
Llama-2-70B on two A100s, max_num_seqs 128, sarathi's token budget 512). For each policy it
runs the command under both installs and compares:

- requests.parquet and iterations.parquet: the same columns in the same order, the same types,
  every value equal (NaN equal to NaN; the per-token times too), read back with pyarrow;
- summary.json: every figure equal, all keys but `wall_time_s` (the wall clock of the run),
  `config` and `settings` (compared too, but printed apart: a newer install may record
  settings that an older one did not have).

    python experiments/bench/bench_identical.py --base /tmp/ref/.venv --new .venv [--requests 10000]

Exit status 1 if any figure or table differs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench_cli_compare import command, install_args, timed_run

from sarathi_lab.run.rundir import json_differences

NOT_FIGURES = ("wall_time_s", "config", "settings")


def differences(a, b, path="") -> list[str]:
    return json_differences(a, b, path, sides=("base", "new"))


def table_differences(a: Path, b: Path) -> list[str]:
    import pyarrow.parquet as pq
    ta, tb = pq.read_table(a), pq.read_table(b)
    if ta.schema.names != tb.schema.names:
        return [f"{a.name}: columns {ta.schema.names} != {tb.schema.names}"]
    out = []
    for name in ta.schema.names:
        ca, cb = ta[name].combine_chunks(), tb[name].combine_chunks()
        if ca.type != cb.type:
            out.append(f"{a.name}.{name}: type {ca.type} != {cb.type}")
        elif not ca.equals(cb):
            # pyarrow's equals treats NaN as unequal: compare those columns as Python values
            va, vb = ca.to_pylist(), cb.to_pylist()
            bad = [i for i, (x, y) in enumerate(zip(va, vb)) if differences(x, y)]
            if bad or len(va) != len(vb):
                i = bad[0] if bad else min(len(va), len(vb))
                out.append(f"{a.name}.{name}: {len(bad)} rows differ, first at row {i}: "
                           f"{va[i] if i < len(va) else None!r} != "
                           f"{vb[i] if i < len(vb) else None!r}")
    if ta.num_rows != tb.num_rows:
        out.append(f"{a.name}: {ta.num_rows} rows != {tb.num_rows}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    install_args(ap)
    args = ap.parse_args()
    installs = {"base": args.base.absolute(), "new": args.new.absolute()}
    env = {**os.environ, "WANDB_MODE": "disabled"}
    cwd = tempfile.mkdtemp()
    failed = False
    for policy in args.policies.split(","):
        dirs = {}
        for kind, venv in installs.items():
            dirs[kind] = Path(tempfile.mkdtemp(dir=cwd))
            timed_run(command(venv, policy, args.requests, args.qps, str(dirs[kind])), env, cwd)
        sa, sb = (json.loads((dirs[k] / "summary.json").read_text()) for k in installs)
        figures = differences({k: v for k, v in sa.items() if k not in NOT_FIGURES},
                              {k: v for k, v in sb.items() if k not in NOT_FIGURES})
        tables = [d for f in ("requests.parquet", "iterations.parquet")
                  for d in table_differences(dirs["base"] / f, dirs["new"] / f)]
        # `name` defaults to the start time (the sweep's name): not a setting of the run
        settings = [d for d in differences({k: sa.get(k) for k in ("config", "settings")},
                                           {k: sb.get(k) for k in ("config", "settings")})
                    if not d.startswith(".config.name:")]
        same = not figures and not tables
        failed |= not same
        print(f"{policy:<14} {'identical' if same else 'DIFFERENT'}: "
              f"{len(sa) - len(NOT_FIGURES)} summary sections, "
              f"{sa['num_requests']} requests, {sa['num_iterations']} iterations"
              + (f"; settings recorded differently in {len(settings)} places" if settings else ""))
        for d in (figures + tables)[:20]:
            print(f"    {d}")
        for d in settings[:5]:
            print(f"    (settings) {d}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
