"""sarathi-lab-report over seeds: configurations, the aggregate table (means and intervals
against hand computation), the plots drawing them, and a report re-drawn from its tables."""
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import slow_fixture
from helpers import patience

from sarathi_lab.report import by_config, labelled, main, make_report, spread, t_quantile

# Student t, 97.5% quantile (two-sided 95%), from the standard tables
T975 = {1: 12.706204736, 2: 4.302652730, 3: 3.182446305, 4: 2.776445105, 9: 2.262157163,
        29: 2.045229642}


def test_t_quantile_matches_the_tables():
    for df, t in T975.items():
        assert t_quantile(0.975, df) == pytest.approx(t, rel=1e-8)
    assert t_quantile(0.025, 3) == pytest.approx(-T975[3], rel=1e-8)
    assert t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-9)


def test_spread_by_hand():
    assert spread([]) == (0, *[pytest.approx(np.nan, nan_ok=True)] * 3)
    assert spread([2.5]) == (1, 2.5, 2.5, 2.5)
    assert spread([1.0, 4.0]) == (2, 2.5, 1.0, 4.0)                  # min-max below 4 seeds
    assert spread([1.0, np.nan, 2.0, 6.0]) == (3, 3.0, 1.0, 6.0)     # the missing one left out
    # 4 seeds: mean 2.5, s = sqrt(5/3), half width t(0.975, 3) * s / 2
    n, mean, lo, hi = spread([1.0, 2.0, 3.0, 4.0])
    half = T975[3] * np.sqrt(5 / 3) / 2
    assert (n, mean) == (4, 2.5)
    assert (lo, hi) == pytest.approx((2.5 - half, 2.5 + half), rel=1e-9)


def test_by_config_by_hand():
    """Two configurations (vllm, sarathi) x seeds; the seed is the only swept setting that
    differs within one; a metric missing for one seed has its own count; true/false metrics
    give the share of seeds."""
    t = pd.DataFrame({
        "run_dir": [f"/r/{i}" for i in range(7)], "policy": ["vllm"] * 3 + ["sarathi"] * 4,
        "scheduler": ["vllm"] * 3 + ["sarathi"] * 4, "seed": [0, 1, 2, 0, 1, 2, 3],
        "model": "m", "trace": "t",
        "tbt_p99": [0.1, 0.3, 0.2, 0.05, 0.07, 0.06, 0.08],
        "ttft_p50": [1.0, np.nan, 2.0, 0.5, 0.5, 0.5, 0.5],
        "slo_meets_tbt_slo": [True, False, False, True, True, True, True]})
    t.attrs["override_keys"] = ["scheduler", "seed"]
    t = labelled(t)
    assert t["config"].tolist() == ["vllm"] * 3 + ["sarathi"] * 4
    assert t["label"].tolist()[:2] == ["vllm (seed=0)", "vllm (seed=1)"]
    agg = by_config(t).set_index("config")
    assert agg.loc["vllm", "n_seeds"] == 3 and agg.loc["sarathi", "n_seeds"] == 4
    assert agg.loc["vllm", "interval"] == "min-max" and agg.loc["sarathi", "interval"] == "t95"
    assert agg.loc["vllm", "seeds"] == "seed=0 seed=1 seed=2"
    v = agg.loc["vllm"]
    assert (v["tbt_p99_mean"], v["tbt_p99_lo"], v["tbt_p99_hi"]) == pytest.approx((0.2, 0.1, 0.3))
    assert (v["ttft_p50_mean"], v["ttft_p50_lo"], v["ttft_p50_hi"], v["ttft_p50_n"]) == \
        pytest.approx((1.5, 1.0, 2.0, 2))
    assert v["slo_meets_tbt_slo_mean"] == pytest.approx(1 / 3)
    assert "slo_meets_tbt_slo_lo" not in agg and "tbt_p99_n" not in agg
    s = agg.loc["sarathi"]
    x = np.array([0.05, 0.07, 0.06, 0.08])
    half = T975[3] * x.std(ddof=1) / 2
    assert (s["tbt_p99_mean"], s["tbt_p99_lo"], s["tbt_p99_hi"]) == \
        pytest.approx((0.065, 0.065 - half, 0.065 + half))
    assert (s["ttft_p50_lo"], s["ttft_p50_hi"]) == (0.5, 0.5)      # no spread: t gives 0 width
    # the configuration's columns, not the seed, and the runs it holds
    assert {"policy", "model", "trace", "scheduler"} <= set(agg.columns)
    assert "seed" not in agg.columns
    assert agg.loc["vllm", "run_dirs"] == "/r/0;/r/1;/r/2"


def _cli(*args, cwd):
    r = subprocess.run([sys.executable, "-c", "from sarathi_lab.cli.main import main; main()", *args],
                       cwd=cwd, env={**os.environ, "WANDB_MODE": "disabled"},
                       capture_output=True, text=True, timeout=patience(300))
    assert r.returncode == 0, r.stdout + r.stderr
    return r


@slow_fixture(scope="module")
def seeded(tmp_path_factory):
    """vllm and sarathi at two loads, three seeds; sarathi with two token budgets that never
    bind (40 short requests: every prompt fits both), so they run the same schedule."""
    root = tmp_path_factory.mktemp("seeds")
    _cli("-m", f"results_root={root}", "name=seeds", "trace=synthetic",
         "trace.num_requests=20", "scheduler=vllm,sarathi",
         "scheduler.token_budget=100000,200000", "trace.qps=2,4", "seed=0,1,2", cwd=root)
    sweep = root / "sweeps" / "seeds"
    return sweep, make_report([sweep], tmp_path_factory.mktemp("out"))


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_the_aggregate_table_over_seeds(seeded):
    sweep, rep = seeded
    t, agg = rep.table, rep.by_config
    assert len(t) == 18 and t["label"].is_unique
    assert len(agg) == 6 and (agg["n_seeds"] == 3).all() and (agg["interval"] == "min-max").all()
    assert set(agg["config"]) == set(t["config"])
    assert not any("seed=" in c for c in agg["config"])
    for f in ("summary_by_config.csv", "summary_by_config.parquet"):
        assert (rep.out / f).stat().st_size > 0
    csv = pd.read_csv(rep.out / "summary_by_config.csv").set_index("config")
    runs = pd.read_csv(rep.out / "summary.csv")
    for config, g in runs.groupby("config"):
        assert sorted(g["seed"]) == [0, 1, 2]
        for m in ("tbt_p99", "ttft_p50", "slo_goodput_rps", "throughput_rps"):
            v = g[m].to_numpy()
            assert csv.loc[config, f"{m}_mean"] == pytest.approx(v.sum() / 3)
            assert csv.loc[config, f"{m}_lo"] == pytest.approx(v.min())
            assert csv.loc[config, f"{m}_hi"] == pytest.approx(v.max())
    md = (rep.out / "report.md").read_text()
    assert "## Configurations over seeds (6)" in md


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_plots_draw_the_aggregate(seeded):
    _, rep = seeded
    agg = rep.by_config.set_index("config")
    ttft = rep.plots["ttft_cdf"][1]
    assert set(ttft["label"]) == set(agg.index)
    for config, d in ttft.groupby("label"):
        at = d[np.isclose(d["q"], 0.5)].iloc[0]
        assert at["n_seeds"] == 3
        assert at["value"] == pytest.approx(agg.loc[config, "ttft_p50_mean"])
        assert (at["lo"], at["hi"]) == pytest.approx((agg.loc[config, "ttft_p50_lo"],
                                                      agg.loc[config, "ttft_p50_hi"]))
    # the two sarathi budgets never bind: drawn once per load, under both names
    sarathi = ttft[ttft["policy"] == "sarathi"]
    assert sarathi["drawn_as"].nunique() == 2
    assert all(" = " in s for s in sarathi["drawn_as"].unique())
    load = rep.plots["load"][1]
    for _, r in load.iterrows():
        assert r["goodput_rps"] == pytest.approx(agg.loc[r["label"], "slo_goodput_rps_mean"])
        assert r["goodput_rps_hi"] == pytest.approx(agg.loc[r["label"], "slo_goodput_rps_hi"])
    # 20 requests: the drain dominates the makespan, so no goodput = load diagonal
    assert load.attrs["reference"] == "ceiling"


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_report_from_an_earlier_reports_tables(seeded, tmp_path, capsys):
    """A directory with only a report's tables (the runs deleted, or committed results) is
    re-drawn from them: the same table, the plots that need no run file."""
    _, rep = seeded
    saved = tmp_path / "saved"
    saved.mkdir()
    for f in ("summary.csv", "summary.parquet"):
        (saved / f).write_bytes((rep.out / f).read_bytes())
    main([str(saved), "--out", str(tmp_path / "again"), "--max-lines", "3"])
    out = capsys.readouterr().out
    assert "18 runs, 0 capacity searches (from an earlier report's tables)" in out
    again = make_report([saved], tmp_path / "again2")
    assert again.from_tables
    assert again.table["label"].tolist() == rep.table["label"].tolist()
    assert again.table["config"].tolist() == rep.table["config"].tolist()
    assert np.allclose(again.by_config["tbt_p99_mean"], rep.by_config["tbt_p99_mean"])
    assert {"budget_tradeoff", "load"} <= set(again.plots)
    assert "requests.parquet" in again.skipped["ttft_cdf"]
    assert "earlier report" in (tmp_path / "again2" / "report.md").read_text()


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_report_options_are_checked(seeded, tmp_path, capsys):
    sweep, _ = seeded
    for bad in (["--max-lines", "0"], ["--max-lines", "x"], ["--capacity-scale", "logs"]):
        with pytest.raises(SystemExit):
            main([str(sweep), "--out", str(tmp_path / "r"), *bad])
        assert bad[0] in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_lines=0"):
        make_report([sweep], tmp_path / "r", max_lines=0)
    # --max-lines 2: the 4 distinct TTFT lines are split into panels
    rep = make_report([sweep], tmp_path / "r2", max_lines=2, timeline="none")
    assert rep.plots["ttft_cdf"][1]["panel"].nunique() > 1
