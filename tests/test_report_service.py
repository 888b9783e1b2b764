"""sarathi-lab-report on runs with SLO classes and tenants: per-class CDFs, goodput per class
against load, service per tenant over time; each plot's data against the summaries (and by hand)."""
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import slow_fixture
from helpers import patience

from sarathi_lab.plots import Skip, slug, tenant_service
from sarathi_lab.report import make_report


@slow_fixture(scope="module")
def report(tmp_path_factory):
    """trace=mix (interactive and batch classes, 11 tenants) at two loads under sarathi."""
    root = tmp_path_factory.mktemp("service")
    r = subprocess.run([sys.executable, "-c", "from sarathi_lab.cli.main import main; main()", "-m",
                        f"results_root={root}", "name=mix", "trace=mix", "slo=chat-batch",
                        "trace.num_requests=60", "trace.qps=1,3"], cwd=root,
                       env={**os.environ, "WANDB_MODE": "disabled"}, capture_output=True,
                       text=True, timeout=patience(180))
    assert r.returncode == 0, r.stdout + r.stderr
    return make_report([root / "sweeps" / "mix"], tmp_path_factory.mktemp("out"))


def _at(d, q):
    return d.loc[np.isclose(d["q"], q), "value"].iloc[0]


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_class_cdfs_draw_each_class_percentiles(report):
    files, data = report.plots["class_cdf"]
    assert files[0].stat().st_size > 1000
    for _, run in report.table.iterrows():
        s = json.loads(open(f"{run['run_dir']}/summary.json").read())
        d = data[data["label"] == run["label"]]
        assert set(d["slo_class"]) == set(s["classes"]) == {"interactive", "batch"}
        for cls, g in s["classes"].items():
            for metric in ("ttft", "tbt"):
                c = d[(d["slo_class"] == cls) & (d["metric"] == metric)]
                for q, p in ((0.5, "p50"), (0.99, "p99")):
                    assert _at(c, q) == pytest.approx(g[metric][p])


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_class_goodput_draws_each_class_against_load(report):
    files, data = report.plots["class_goodput"]
    assert files[0].stat().st_size > 1000
    t = report.table.set_index("label")
    assert len(data) == 2 * 2 and sorted(data["offered_qps"].unique()) == [1, 3]
    for _, r in data.iterrows():
        assert r["goodput_rps"] == t.loc[r["label"], f"classes_{r['slo_class']}_goodput_rps"]
        assert r["attainment"] == t.loc[r["label"], f"classes_{r['slo_class']}_attainment"]
    # the classes' goodputs add up to the run's
    total = data.groupby("label")["goodput_rps"].sum()
    assert np.allclose(total, t.loc[total.index, "slo_goodput_rps"])


@pytest.mark.slow   # its module fixture runs a sweep in CLI subprocesses
def test_tenant_service_ends_at_each_tenant_service(report):
    names = [n for n in report.plots if n.startswith("tenant_service")]
    assert len(names) == 2   # one per run: both have 11 tenants
    for _, run in report.table.iterrows():
        s = json.loads(open(f"{run['run_dir']}/summary.json").read())
        name = f"tenant_service_{slug(run['label'])}"
        data = report.plots[name][1]
        end = data[data["t"] == data["t"].max()].set_index("tenant")["service_tokens"]
        served = {k: v["service_tokens"] for k, v in s["tenants"].items()}
        top = sorted(served, key=served.get, reverse=True)[:10]
        assert set(end.index) == set(top) | {"1 other tenant"}
        for k in top:
            assert end[k] == pytest.approx(served[k])
        assert end["1 other tenant"] == pytest.approx(sum(served.values()) - sum(
            served[k] for k in top))
        # cumulative: never decreasing
        assert (data.groupby("tenant")["service_tokens"].diff().dropna() >= 0).all()


def test_tenant_service_by_hand(tmp_path):
    """a: prompt 4, tokens at 1, 2, 3; b: prompt 2, tokens at 2, 4. Prompt tokens weigh 1 (at
    the first token), output tokens 2."""
    pd.DataFrame({"tenant": ["a", "b"], "num_prompt_tokens": [4, 2],
                  "token_times": [[1.0, 2.0, 3.0], [2.0, 4.0]]}).to_parquet(
        tmp_path / "requests.parquet")
    row = pd.Series({"run_dir": str(tmp_path), "label": "hand", "policy": "sarathi"})
    files, data = tenant_service(row, tmp_path / "ts", points=4)
    wide = data.pivot(index="t", columns="tenant", values="service_tokens")
    assert wide.index.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert wide["a"].tolist() == [0, 6, 8, 10, 10]
    assert wide["b"].tolist() == [0, 0, 4, 4, 6]
    pd.DataFrame({"tenant": ["a", "a"], "num_prompt_tokens": [4, 2],
                  "token_times": [[1.0], [2.0]]}).to_parquet(tmp_path / "requests.parquet")
    with pytest.raises(Skip, match="fewer than two tenants"):
        tenant_service(row, tmp_path / "ts")


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_single_class_runs_skip_the_class_plots(tmp_path):
    r = subprocess.run([sys.executable, "-c", "from sarathi_lab.cli.main import main; main()",
                        f"hydra.run.dir={tmp_path}/run", "trace=synthetic",
                        "trace.num_requests=20"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "WANDB_MODE": "disabled"}, timeout=patience(120))
    assert r.returncode == 0, r.stderr
    rep = make_report([tmp_path / "run"], tmp_path / "out")
    assert "two or more SLO classes" in rep.skipped["class_cdf"]
    assert "two SLO classes" in rep.skipped["class_goodput"]
    assert "two or more tenants" in rep.skipped["tenant_service"]
    assert "closed-loop" in rep.skipped["open_closed"]
