"""sarathi-lab-plan: the cheapest deployment that serves a load within the SLO.

  sarathi-lab-plan [KEY=VALUE ...]

Overrides as for sarathi-lab (model=..., trace=..., slo=..., any run setting) and the plan's own
(plan.load_qps=..., plan.space.hardware=[a100-80gb,h100-sxm], plan.space.layout.tensor_parallel=
[1,2], plan.space.split=[colocated,1:1], plan.space.policy=[sarathi,vllm], plan.backend=ray, ...;
configs/plan.yaml lists them all). Writes results_root/plans/<name>/: plan.parquet (every
configuration), pareto.png, evals/ (one directory per configuration; a rerun with the same name
reuses them). Prints the ranked table and, for each row, the sarathi-lab command that reproduces
it. Exit status 1 when no configuration of the space meets the SLO at the load.
sarathi_lab/docs/planning.md explains the search."""
from __future__ import annotations

import sys
from pathlib import Path

from sarathi_lab.plan import table
from sarathi_lab.plan.search import run_plan
from sarathi_lab.settings import ConfigError

PLAN_KEYS = ("plan.", "+plan.", "name=", "results_root=")


def plan_dir(c: dict) -> Path:
    p = c["plan"]
    return Path(p["dir"]) if p.get("dir") else Path(c["results_root"]) / "plans" / str(c["name"])


def main(argv: list[str] | None = None) -> int:
    from sarathi_lab.sweeps.bookkeeping import compose_config
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    try:
        c = compose_config(argv, "plan")
        base = [a for a in argv if not a.startswith(PLAN_KEYS)]
        out = plan_dir(c)
        user = [a.split("=", 1)[0].lstrip("+~") for a in argv if a.startswith(PLAN_KEYS[:2])]
        rows = run_plan(c["plan"], base, out, user=user)
    except ConfigError as e:
        sys.stderr.write(f"sarathi-lab-plan: error: {e}\n")
        return 2
    df = table.ranked(rows)
    paths = table.write(df, out)
    print(table.format_table(df, c["plan"]["top"]))
    print("\n" + "\n".join(f"wrote {p}" for p in paths))
    if not (df["status"] == "feasible").any():
        sys.stderr.write("sarathi-lab-plan: no configuration of the space meets the SLO at the "
                         "load (plan.parquet says why for each; widen plan.space or raise "
                         "plan.space.max_replicas)\n")
        return 1
    return 0


def console() -> None:
    sys.exit(main())
