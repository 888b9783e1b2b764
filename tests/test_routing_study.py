"""experiments/routing at toy scale: one command writes the table, every router runs on both
workloads, and the figures say what the design implies."""
import importlib.util
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.slow   # a study at toy scale

RUN = Path(__file__).resolve().parents[1] / "experiments" / "routing" / "run.py"


def test_routing_study_at_toy_scale(tmp_path):
    spec = importlib.util.spec_from_file_location("routing_study", RUN)
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    study.main(["--replicas", "2", "--qps", "2.5", "--per-replica", "12", "--out",
                str(tmp_path)])
    df = pd.read_csv(tmp_path / "routing.csv")
    assert len(df) == 2 * len(study.ROUTERS)
    assert set(df["router"]) == set(study.ROUTERS) and set(df["prefixes"]) == {"shared", "unique"}
    assert (df["num_rejected"] == 0).all() and df["goodput_rps"].gt(0).all()
    unique = df[df["prefixes"] == "unique"].set_index("router")
    shared = df[df["prefixes"] == "shared"].set_index("router")
    # nothing to share: no hit anywhere, and affinity falls back to least_loaded's choices
    assert (unique["prefix_hit_rate"] == 0).all()
    figures = ["p99_ttft_s", "p99_tbt_s", "goodput_rps", "imbalance"]
    pd.testing.assert_series_equal(unique.loc["prefix_affinity", figures],
                                   unique.loc["least_loaded", figures], check_names=False)
    # shared contexts: affinity finds at least the hits that a blind router does
    assert shared.loc["prefix_affinity", "prefix_hit_rate"] > 0
    assert shared.loc["prefix_affinity", "prefix_hit_rate"] >= \
        shared.loc["round_robin", "prefix_hit_rate"]
