"""The open_vs_closed study at toy scale: closed-loop runs, open-loop runs at their arrival
rates, the pairs table and the report's open/closed plot."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from study_scripts import load_study

pytestmark = pytest.mark.slow   # a study at toy scale


def test_open_vs_closed_at_toy_scale(tmp_path):
    rep, pairs = load_study("open_vs_closed").run_study(tmp_path, tmp_path / "out", [
        "trace=synthetic", "trace.num_requests=30", "trace.clients=2,6",
        "trace.think_time=0.5"])
    t = rep.table
    closed, opened = t[t["clients"].notna()], t[t["clients"].isna()]
    assert sorted(closed["clients"]) == [2, 6] and len(opened) == 2
    assert pairs["clients"].tolist() == [2, 6]
    for _, p in pairs.iterrows():
        c = closed[closed["clients"] == p["clients"]].iloc[0]
        # the open run was given the closed run's arrival rate (4 significant digits)
        assert p["open_qps"] == float(f"{c['offered_load_requests_per_s']:.4g}")
        s = json.loads((Path(c["run_dir"]) / "summary.json").read_text())
        assert s["config"]["trace"]["clients"] == p["clients"]
        assert p["closed_ttft_p99"] == s["ttft"]["p99"]
        o = opened[opened["offered_qps"] == p["open_qps"]].iloc[0]
        so = json.loads((Path(o["run_dir"]) / "summary.json").read_text())
        assert so["config"]["trace"]["clients"] is None
        assert p["open_ttft_p99"] == so["ttft"]["p99"]
        assert p["throughput_ratio_open_closed"] == so["throughput_rps"] / s["throughput_rps"]
    files, data = rep.plots["open_closed"]
    assert files[0].stat().st_size > 1000
    assert sorted(data["mode"]) == ["closed", "closed", "open", "open"]
    for _, r in data.iterrows():
        row = t[t["label"] == r["label"]].iloc[0]
        assert r["ttft_p99"] == row["ttft_p99"] and r["throughput_rps"] == row["throughput_rps"]
        q = data.attrs["cdf"]
        q = q[q["label"] == r["label"]]
        ttft = pd.read_parquet(Path(r["run_dir"]) / "requests.parquet")["ttft"].dropna()
        assert np.isclose(q.loc[np.isclose(q["q"], 0.5), "value"].iloc[0], ttft.median())
    assert (tmp_path / "out" / "pairs.csv").exists()
