"""sarathi-lab-report: the table, every plot, and that each plot draws what the table says."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import slow_fixture
from helpers import patience

from sarathi_lab.metrics import tbt_gaps
from sarathi_lab.report import main, make_report

TINY = ["trace=synthetic", "trace.num_requests=40"]


def cli(*args, cwd):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    r = subprocess.run([sys.executable, "-c", "from sarathi_lab.cli.main import main; main()", *args],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=patience(180))
    assert r.returncode == 0, r.stdout + r.stderr
    return r


@slow_fixture(scope="module")
def inputs(tmp_path_factory):
    """A 2 x 2 x 2 sweep (policy, token budget, load): vllm reads no token budget, so its four
    combinations run as two (merged); and two small capacity searches."""
    root = tmp_path_factory.mktemp("report")
    cli("-m", f"results_root={root}", "name=grid", *TINY, "scheduler=vllm,sarathi",
        "scheduler.token_budget=256,512", "trace.qps=2,4", cwd=root)
    cli("-m", f"results_root={root}", "name=cap", "mode=capacity", *TINY,
        "scheduler=vllm,sarathi", "slo.ttft=1.0", "slo.tpot=0.1",   # both criteria defined
        "capacity.qps_low=0.5", "capacity.qps_high=4", "capacity.precision=0.1", cwd=root)
    return root / "sweeps" / "grid", root / "sweeps" / "cap"


@pytest.fixture(scope="module")
def report(inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    return make_report(list(inputs), out, pdf=True)


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_table_has_a_row_per_run_and_the_swept_columns(report):
    t = report.table
    assert len(t) == 6
    # the merged vllm runs are labelled once, without the budget they do not read
    assert sorted(t.loc[t["policy"] == "vllm", "label"]) == ["vllm (qps=2)", "vllm (qps=4)"]
    assert t.loc[t["policy"] == "vllm", "token_budget"].isna().all()
    assert {"scheduler", "scheduler.token_budget", "trace.qps"} <= set(t.columns)
    assert {"tbt_p99", "ttft_p50", "tpot_p99", "slo_goodput_rps", "slo_attainment",
            "stalls_count", "throughput_rps"} <= set(t.columns)
    assert t["label"].is_unique
    for f in ("summary.csv", "summary.parquet", "capacity.csv", "capacity.parquet", "report.md"):
        assert (report.out / f).stat().st_size > 0
    csv = pd.read_csv(report.out / "summary.csv")
    assert len(csv) == 6 and np.allclose(csv["tbt_p99"], t["tbt_p99"])
    assert len(pd.read_parquet(report.out / "summary.parquet")) == 6


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_every_supported_plot_is_made(report):
    assert set(report.plots) == {"ttft_cdf", "tbt_cdf", "budget_tradeoff", "load", "capacity"}
    for name, (files, data) in report.plots.items():
        assert {f.suffix for f in files} == {".png", ".pdf"}
        assert all(f.stat().st_size > 1000 for f in files), name
        assert not data.empty, name
    assert "up to 4" in report.skipped["timeline"]   # 6 runs: said, not silently dropped


def _at(data, label, q):
    d = data[data["label"] == label]
    return d.loc[np.isclose(d["q"], q), "value"].iloc[0]


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_cdfs_draw_the_table_percentiles(report):
    t = report.table.set_index("label")
    ttft, tbt = report.plots["ttft_cdf"][1], report.plots["tbt_cdf"][1]
    assert set(ttft["label"]) == set(tbt["label"]) == set(t.index)
    for label, row in t.iterrows():
        for q, col in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
            assert np.isclose(_at(ttft, label, q), row[f"ttft_{col}"])
            assert np.isclose(_at(tbt, label, q), row[f"tbt_{col}"])


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_budget_and_load_plots_draw_the_table(report):
    t = report.table.set_index("label")
    budget = report.plots["budget_tradeoff"][1]
    assert len(budget) == 6 and set(budget["label"]) == set(t.index)
    for _, r in budget.iterrows():
        want = t.loc[r["label"], "token_budget"]
        assert r["token_budget"] == want or (pd.isna(want) and pd.isna(r["token_budget"]))
        assert np.isclose(r["tbt_p99"], t.loc[r["label"], "tbt_p99"])
        assert np.isclose(r["ttft_p50"], t.loc[r["label"], "ttft_p50"])
    # one line per policy and load: sarathi's across both budgets, vllm's a level (one run)
    assert budget.groupby("series").size().to_dict() == {
        "sarathi (qps=2)": 2, "sarathi (qps=4)": 2, "vllm (qps=2)": 1, "vllm (qps=4)": 1}
    load = report.plots["load"][1]
    assert len(load) == 6
    for _, r in load.iterrows():
        assert r["offered_qps"] == t.loc[r["label"], "offered_qps"]
        assert np.isclose(r["goodput_rps"], t.loc[r["label"], "slo_goodput_rps"])
        assert np.isclose(r["attainment"], t.loc[r["label"], "slo_attainment"])


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_capacity_plot_draws_the_searches(report):
    cap, data = report.capacity, report.plots["capacity"][1]
    assert set(cap["policy"]) == {"vllm", "sarathi"}
    assert set(cap["criterion"]) == {"tbt", "attainment"}
    merged = data.merge(cap, on=["label", "criterion"], suffixes=("", "_t"))
    assert len(merged) == len(cap) == 4
    assert np.allclose(merged["capacity_qps"], merged["capacity_qps_t"])


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_single_run_timeline_and_honest_skips(inputs, tmp_path):
    run = sorted(p.parent for p in inputs[0].rglob("summary.json"))[0]
    rep = make_report([run], tmp_path)
    assert set(rep.plots) == {"ttft_cdf", "tbt_cdf", "timeline"}
    assert "token budget" in rep.skipped["budget_tradeoff"]
    assert "load" in rep.skipped["load"]
    assert "capacity" in rep.skipped["capacity"]
    files, data = rep.plots["timeline"]
    assert files[0].name == "timeline.png" and files[0].stat().st_size > 1000
    req = pd.read_parquet(run / "requests.parquet")
    gaps = data[data["series"] == "tbt_gap"]
    assert np.allclose(np.sort(gaps["value"]), np.sort(tbt_gaps(req)[0]))
    it = pd.read_parquet(run / "iterations.parquet")
    a, b = data.attrs["window"]
    shown = it[(it["start"] + it["duration"] >= a) & (it["start"] <= b)]
    pre = data[data["series"] == "prefill_tokens"]
    assert len(pre) == len(shown) and pre["value"].sum() == shown["prefill_tokens"].sum()


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_report_command(inputs, tmp_path, capsys):
    main([str(inputs[0]), "--out", str(tmp_path / "r"), "--timeline", "none"])
    out = capsys.readouterr().out
    assert "6 runs" in out and "skipped timeline" in out
    assert (tmp_path / "r" / "tbt_cdf.png").exists()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "nothing_here")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no summary.json"):
        main([str(tmp_path / "empty")])
    # the library raises; only the command exits
    with pytest.raises(FileNotFoundError, match="no summary.json or capacity.json below .*empty"):
        make_report([tmp_path / "empty"], tmp_path / "not_made")
    assert not (tmp_path / "not_made").exists()
    assert Path(tmp_path / "r" / "report.md").read_text().count("![") == 4


def test_tbt_gaps_with_times_by_hand():
    req = pd.DataFrame({"token_times": [[0.0, 1.0, 3.0], [2.0], [], [5.0, 5.5]]})
    gaps, owner, ends = tbt_gaps(req, with_times=True)
    assert gaps.tolist() == [1.0, 2.0, 0.5]
    assert owner.tolist() == [0, 0, 3]
    assert ends.tolist() == [1.0, 3.0, 5.5]
    assert [a.tolist() for a in tbt_gaps(req)] == [[1.0, 2.0, 0.5], [0, 0, 3]]
    assert all(len(a) == 0 for a in tbt_gaps(req.iloc[1:3], with_times=True))


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_drawing_leaves_the_matplotlib_backend_alone(inputs, tmp_path):
    """Importing the plots and drawing select no backend and open no pyplot figures."""
    run = sorted(p.parent for p in inputs[0].rglob("summary.json"))[0]
    code = ("import sys, matplotlib; from sarathi_lab.report import make_report; "
            f"rep = make_report([{str(run)!r}], {str(tmp_path)!r}); "
            "assert 'timeline' in rep.plots, rep.skipped; "
            "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'; "
            "print('BACKEND', matplotlib.get_backend())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=patience(120),
                       env={**os.environ, "MPLBACKEND": "template"})
    assert r.returncode == 0, r.stderr
    assert "BACKEND template" in r.stdout
    assert (tmp_path / "timeline.png").stat().st_size > 1000
