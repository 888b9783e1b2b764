"""experiments/disaggregation at toy scale: one command writes the tables and the plots; goodput
per GPU is the capacity over the 4 GPUs; a slower link never serves more; a tighter TPOT target
never passes more requests."""
import pandas as pd
import pytest
from study_scripts import load_study

pytestmark = pytest.mark.slow   # a study at toy scale


def test_disaggregation_study_at_toy_scale(tmp_path):
    study = load_study("disaggregation")
    study.main(["--workloads", "chat", "--ratios", "2:2", "--links", "nvlink", "1.25GB/s",
                "--colocated", "sarathi-512", "--requests", "40", "--precision", "0.15",
                "--rates", "4", "16", "--jobs", "1", "--out", str(tmp_path)])
    df = pd.read_csv(tmp_path / "capacity.csv")
    assert df["system"].tolist() == ["colocated-sarathi-512", "2P2D", "2P2D"]
    assert df["link"].fillna("").tolist() == ["", "nvlink", "1.25GB/s"]
    assert (df["num_gpus"] == 4).all() and df["bracketed"].all()
    assert df["goodput_per_gpu"].tolist() == pytest.approx((df["capacity_qps"] / 4).tolist(),
                                                           rel=1e-3)
    assert (df["attainment"] >= 0.9).all()   # at the capacity found, the SLO holds
    dis = df[df["prefill"] > 0].set_index("link")
    assert dis.loc["nvlink", "capacity_qps"] >= dis.loc["1.25GB/s", "capacity_qps"]
    assert dis.loc["1.25GB/s", "transfer_p50_ms"] > 20 * dis.loc["nvlink", "transfer_p50_ms"]
    assert df.loc[df["prefill"] == 0, "transfer_p50_ms"].isna().all()
    probes = pd.read_csv(tmp_path / "probes.csv")
    assert set(probes["system"]) == {"colocated-sarathi-512", "2P2D"} and len(probes) >= 6
    grid = pd.read_csv(tmp_path / "tpot_sweep.csv")
    assert len(grid) == 2 * 2 * len(study.TPOTS)          # systems x rates x TPOT targets
    for _, g in grid.groupby(["system", "qps"]):
        att = g.sort_values("tpot_slo_s", ascending=False)["attainment"].tolist()
        assert att == sorted(att, reverse=True)           # tighter target, fewer pass
    cross = pd.read_csv(tmp_path / "tpot_capacity.csv").set_index(["system", "tpot_slo_s"])
    for system in ("colocated-sarathi-512", "2P2D"):
        assert cross.loc[(system, 0.1), "capacity_qps"] >= cross.loc[(system, 0.02),
                                                                      "capacity_qps"]
    assert study.crossing([2, 4, 8], [1.0, 0.95, 0.85]) == (pytest.approx(6.0), True)
    assert study.crossing([2, 4], [0.8, 0.5]) == (2, False)
    for name in ("capacity.png", "tpot_sweep.png"):
        assert (tmp_path / name).stat().st_size > 5000
