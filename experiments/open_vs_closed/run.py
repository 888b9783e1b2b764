"""open_vs_closed: one server measured by closed-loop users and by open-loop arrivals at the
throughput the closed loop realised (experiments/open_vs_closed/README.md).

    python experiments/open_vs_closed/run.py                        # ~75 s on 2 cores
    python experiments/open_vs_closed/run.py --root /tmp/x --out /tmp/x/report trace=synthetic ...

1. `sarathi-lab -m experiment=open_vs_closed`: one closed-loop run per number of users.
2. Each closed run's arrival rate (its users' sending rate over the run: offered_load
   requests/s) becomes an open-loop Poisson rate: the same requests, the same server.
3. `sarathi-lab-report` over both sweeps (its `open_closed` plot draws TTFT against realised
   throughput and the TTFT CDFs) and `pairs.csv`: each closed run beside its open twin.
Extra arguments are Hydra overrides given to both sweeps.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments"))
from studies import sweep  # noqa: E402


def matched_rates(closed_dir: Path) -> list[float]:
    """The closed runs' arrival rates, rounded to 4 significant digits (a Hydra value)."""
    from sarathi_lab.report import run_table
    t = run_table([closed_dir])
    return sorted({float(f"{q:.4g}") for q in t["offered_load_requests_per_s"]})


def pairs(table):
    """Each closed-loop run beside the open-loop run at its arrival rate."""
    import pandas as pd
    closed, opened = table[table["clients"].notna()], table[table["clients"].isna()]
    cols = ["offered_load_requests_per_s", "throughput_rps", "ttft_p50", "ttft_p90", "ttft_p99",
            "tbt_p99", "e2e_p50", "e2e_p99", "slo_attainment", "slo_goodput_rps",
            "queue_mean"]
    rows = []
    for _, c in closed.sort_values("clients").iterrows():
        rate = float(f"{c['offered_load_requests_per_s']:.4g}")
        same = opened[opened["offered_qps"] == rate]
        if same.empty:
            raise ValueError(f"no open-loop run at {rate} req/s, the arrival rate of the "
                             f"closed run with {c['clients']:g} users")
        o = same.iloc[0]
        row = {"clients": int(c["clients"]), "open_qps": o["offered_qps"]}
        for k in cols:
            row[f"closed_{k}"], row[f"open_{k}"] = c.get(k), o.get(k)
        row["throughput_ratio_open_closed"] = o["throughput_rps"] / c["throughput_rps"]
        rows.append(row)
    return pd.DataFrame(rows)


def run_study(root: Path, out: Path, overrides: list[str]):
    """Both sweeps, the report and pairs.csv; returns (the report, the pairs)."""
    closed = sweep("open_vs_closed", root, "open_vs_closed_closed", overrides)
    rates = matched_rates(closed)
    opened = sweep("open_vs_closed", root, "open_vs_closed_open", [
        *overrides, "trace.clients=null", "trace.think_time=null",
        "trace.qps=" + ",".join(map(str, rates))])
    from sarathi_lab.report import make_report
    rep = make_report([closed, opened], out)
    p = pairs(rep.table)
    p.to_csv(out / "pairs.csv", index=False)
    return rep, p


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(REPO / "outputs"), help="results_root of the sweeps")
    ap.add_argument("--out", default=str(REPO / "results" / "open_vs_closed"))
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for both sweeps")
    a = ap.parse_args(argv)
    _, p = run_study(Path(a.root).resolve(), Path(a.out), a.overrides)
    import pandas as pd
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(p[["clients", "closed_offered_load_requests_per_s", "open_qps",
                 "closed_throughput_rps", "open_throughput_rps", "closed_ttft_p50",
                 "open_ttft_p50", "closed_ttft_p99", "open_ttft_p99", "closed_slo_attainment",
                 "open_slo_attainment"]].to_string(index=False, float_format="%.3g"))
    print(f"-> {a.out}")


if __name__ == "__main__":
    main()
