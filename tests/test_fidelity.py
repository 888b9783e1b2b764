"""The fidelity study (experiments/fidelity/: run.py, its library fidelity_lib/ and the scripts
beside it): its comparison computed by hand, and the whole study at toy scale (profile, real runs,
simulated runs, table, plots) in seconds."""
import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import slow_fixture
from study_scripts import library_on_path, load_study

from sarathi_lab.costmodels.profiles import ProfileError

library_on_path("fidelity")
from fidelity_lib import (  # noqa: E402
    bias,
    interval,
    jitter,
    kept,
    report,
    residuals,
    runs,
    speed,
    study,
)

F = load_study("fidelity")   # run.py, the command line


def figs(v):
    return {runs.metric_name(m, q): v for m, q in runs.METRICS}


def test_verdict_by_hand():
    """Five runs of 1, 2, 3, 4, 5 (the same on every figure): mean 3, sample sd sqrt(10 / 4) =
    1.5811, t(0.95, 4 df) = 2.132, half-width 2.132 x 1.5811 / sqrt(5) = 1.5076: the interval
    [1.4924, 4.5076]. A simulated 4 lies inside it (error +1/3), a 5 outside (+2/3)."""
    real = {"orca": [figs(v) for v in (1.0, 2.0, 3.0, 4.0, 5.0)]}
    sim = {"orca": {**figs(5.0), "ttft_p50": 4.0}}
    t = bias.verdict(real, sim)
    assert len(t) == len(runs.METRICS) and set(t["policy"]) == {"orca"}
    row = t[t.metric == "ttft_p50"].iloc[0]
    assert row.real_mean == 3.0 and row.repeats == 5
    assert row.real_lo == pytest.approx(1.4924, abs=1e-4)
    assert row.real_hi == pytest.approx(4.5076, abs=1e-4)
    assert row.half_width == pytest.approx(1.5076 / 3, abs=1e-4)
    assert row.real_spread == pytest.approx(4 / 3)
    assert row.error == pytest.approx(1 / 3) and row.inside
    other = t[t.metric == "tbt_p99"].iloc[0]
    assert other.error == pytest.approx(2 / 3) and not other.inside
    # over the goal's four figures: errors 1/3, 2/3, 2/3, 2/3: mean 7/12, sd (ddof 1) 1/6
    b = bias.bias(t, bias.GOAL)
    assert b["figures"] == 4 and b["inside"] == 1
    assert b["bias"] == pytest.approx(7 / 12) and b["error_sd"] == pytest.approx(1 / 6)
    assert b["mean_abs_error"] == pytest.approx(7 / 12)
    # over all nine latency figures (throughput and iteration counts left out): one inside
    assert bias.bias(t)["figures"] == 9 and bias.bias(t)["inside"] == 1
    md = report.verdict_markdown(t, "x")
    assert "| orca | +33.3% (±50.3%) | +66.7% (±50.3%) **out** |" in md
    assert "bias (mean signed error) **+58.3%**" in md


def test_bias_interval_by_hand():
    """Three rounds; orca's runs 1, 2, 4 and vllm's 2, 2, 2 on every figure, both simulated at 2.
    Per round, the mean error over the two policies: (1 + 0) / 2 = 0.5, 0, (-0.5 + 0) / 2 =
    -0.25; their mean 1/12, sample sd sqrt(0.14583) = 0.38188, t(0.95, 2 df) = 2.920:
    half-width 2.920 x 0.38188 / sqrt(3) = 0.64380, about the bias against the runs' means:
    orca 2 / (7/3) - 1 = -1/7, vllm 0, mean -1/14."""
    real = {"orca": [figs(v) for v in (1.0, 2.0, 4.0)], "vllm": [figs(2.0)] * 3}
    sim = {"orca": figs(2.0), "vllm": figs(2.0)}
    b = bias.bias_interval(real, sim, bias.GOAL)
    assert b["per_round"] == pytest.approx([0.5, 0.0, -0.25])
    assert b["bias"] == pytest.approx(-1 / 14)
    assert b["bias"] == pytest.approx(bias.bias(bias.verdict(real, sim), bias.GOAL)["bias"])
    assert b["half_width"] == pytest.approx(0.64380, abs=1e-5)
    assert b["lo"] == pytest.approx(-1 / 14 - 0.64380, abs=1e-5)
    assert b["hi"] == pytest.approx(-1 / 14 + 0.64380, abs=1e-5)
    with pytest.raises(ValueError, match="as many rounds"):
        bias.bias_interval({"orca": real["orca"], "vllm": real["vllm"][:2]}, sim)


def test_matched_bias_by_hand():
    """Log levels -1, 0, 1 with round biases 1, 0, 2: the least-squares line 1 + 0.5 x; its
    residuals 0.5, -1, 0.5 (sum of squares 1.5 over 1 degree of freedom), the intercept's
    variance 1.5 / 3, half-width t95(1) sqrt(0.5) = 4.4646; correlation 1 / sqrt(2 x 2)."""
    m = bias.matched_bias([1.0, 0.0, 2.0], np.exp([-1.0, 0.0, 1.0]))
    assert m["bias"] == pytest.approx(1.0) and m["slope"] == pytest.approx(0.5)
    assert m["hi"] - m["bias"] == pytest.approx(6.314 * np.sqrt(0.5))
    assert m["r"] == pytest.approx(0.5) and m["rounds"] == 3
    # biases exactly on a line: the line itself, with no width
    x = np.array([0.0, 0.1, -0.1, 0.2])
    m = bias.matched_bias(-0.02 - 1.1 * x, np.exp(x))
    assert m["bias"] == pytest.approx(-0.02) and m["slope"] == pytest.approx(-1.1)
    assert m["hi"] - m["lo"] == pytest.approx(0.0, abs=1e-12) and m["r"] == pytest.approx(-1)
    with pytest.raises(ValueError, match=">= 3"):
        bias.matched_bias([0.1, 0.2], [1.0, 1.1])
    with pytest.raises(ValueError, match="same level"):
        bias.matched_bias([0.1, 0.2, 0.0], [1.0, 1.0, 1.0])


def test_round_levels_by_hand():
    """Round 0: orca's and vllm's steps, 3 + 1 ms measured against 2 + 2 predicted: 1.0;
    round 1: 3 ms against 2: 1.5. Rounds by their number, not their order in the table."""
    res = pd.DataFrame({"run": ["x/orca/real-1", "x/orca/real-0", "x/vllm/real-0"],
                        "measured_s": [3e-3, 3e-3, 1e-3], "predicted_s": [2e-3, 2e-3, 2e-3]})
    assert bias.round_levels(res) == pytest.approx([1.0, 1.5])
    with pytest.raises(ValueError, match="real-<i>"):
        bias.round_levels(res.assign(run="x/orca/sim"))


def test_t_quantiles():
    """The table's ends and the series beyond it, against published values (t 0.95 at 40 and
    120 degrees of freedom: 1.6839, 1.6577); fewer than two runs have no interval."""
    assert interval.t95(1) == 6.314 and interval.t95(4) == 2.132 and interval.t95(30) == 1.697
    assert interval.t95(40) == pytest.approx(1.6839, abs=2e-4)
    assert interval.t95(120) == pytest.approx(1.6577, abs=2e-4)
    with pytest.raises(ValueError, match="at least 2 runs"):
        interval.mean_interval([1.0])


def test_residuals_by_composition(tmp_path):
    """Each iteration's recorded batch priced by the cost model, grouped by composition."""
    class Cost:   # 1 ms per iteration + 1 us per token + 1 us per token of context
        rewarm = None

        def iteration_time(self, prefills, decodes, sampled):
            return 1e-3 + 1e-6 * (sum(c + k for c, k in prefills) + len(decodes) + sum(decodes))
    shapes = [([], [99, 199], 2), ([(64, 0)], [], 1), ([(32, 32)], [10], 1)]
    pred = [1e-3 + 1e-6 * 300, 1e-3 + 64e-6, 1e-3 + 1e-6 * (64 + 11)]
    pd.DataFrame({"num_requests": [2, 1, 2], "duration": [2 * pred[0], pred[1], 1.5 * pred[2]],
                  "host_s": [1e-5, 2e-5, 3e-5]}).to_parquet(tmp_path / "iterations.parquet")
    res = residuals.residuals([tmp_path], [shapes], Cost())
    assert res["composition"].tolist() == ["decode b=2-4", "prefill c=1-128", "mixed"]
    assert res["predicted_s"].tolist() == pytest.approx(pred)
    t = residuals.residual_table(res).set_index("composition")
    assert list(t.index) == ["decode b=2-4", "prefill c=1-128", "mixed"]
    assert t.loc["decode b=2-4", "ratio_p50"] == pytest.approx(2.0)
    assert t.loc["mixed", "ratio_of_sums"] == pytest.approx(1.5)
    assert t.loc["prefill c=1-128", "resid_ms_p50"] == pytest.approx(0.0)
    assert t["time_share"].sum() == pytest.approx(1.0)
    h = residuals.host_table(res).set_index("requests")
    assert h.loc["1", "host_us_p50"] == pytest.approx(20.0)
    assert h.loc["2-4", "host_share"] == pytest.approx(4e-5 / (2 * pred[0] + 1.5 * pred[2]))
    with pytest.raises(ValueError, match="3 iterations but 2 recorded batches"):
        residuals.residuals([tmp_path], [shapes[:2]], Cost())


def test_residuals_charge_each_decode_the_rewarm_of_its_place(tmp_path):
    """With a profile's decode_rewarm rows, each iteration is predicted as the simulation prices
    it: a decode-only step at place p after a prompt step of T tokens times factor(T, p)."""
    from sarathi_lab.costmodels.rewarm import Rewarm

    class Cost:   # 1 ms an iteration; decodes after a prompt of 64: 2x, then 1.5x, then 1x
        rewarm = Rewarm([64], [1, 2], [[2.0, 1.5]])

        def iteration_time(self, prefills, decodes, sampled):
            return 1e-3
    shapes = [([(64, 0)], [], 1), ([], [64], 1), ([], [65], 1), ([], [66], 1),
              ([(32, 0)], [67], 2), ([], [68, 32], 2)]
    pd.DataFrame({"num_requests": [1, 1, 1, 1, 2, 2], "duration": [1e-3] * 6,
                  "host_s": [0.0] * 6}).to_parquet(tmp_path / "iterations.parquet")
    res = residuals.residuals([tmp_path], [shapes], Cost())
    # a prompt step of 32 tokens: below the one measured size, read as it (flat)
    assert res["rewarm_factor"].tolist() == [1.0, 2.0, 1.5, 1.0, 1.0, 2.0]
    assert res["predicted_s"].tolist() == pytest.approx([1e-3, 2e-3, 1.5e-3, 1e-3, 1e-3, 2e-3])


def test_decodes_by_their_place_in_a_run_of_them():
    """Each single-request decode's place in a run of consecutive ones (1: the first after a
    step of another kind; 0: another kind), and the table by place, by hand."""
    comps = ["prefill c=1-128", "decode b=1", "decode b=1", "decode b=1", "mixed", "decode b=1",
             "decode b=2-4", "decode b=1", "decode b=1"]
    pos = residuals.stream_positions(comps)
    assert pos == [0, 1, 2, 3, 0, 1, 0, 1, 2]
    res = pd.DataFrame({"stream_pos": pos, "measured_s": [9, 3, 2, 1, 9, 6, 9, 3, 4],
                        "predicted_s": [1, 2, 2, 2, 1, 2, 1, 2, 2]})
    t = residuals.stream_table(res).set_index("place")
    assert list(t.index) == ["1", "2", "3-4"]
    assert t["iterations"].tolist() == [3, 2, 1]
    assert t.loc["1", "ratio_p50"] == pytest.approx(1.5)          # 3/2, 6/2, 3/2
    assert t.loc["1", "ratio_of_sums"] == pytest.approx(12 / 6)
    assert t.loc["2", "ratio_of_sums"] == pytest.approx(6 / 4)
    assert t.loc["3-4", "measured_ms_p50"] == pytest.approx(1e3)


@slow_fixture(scope="module")
def toy(tmp_path_factory):
    n = torch.get_num_threads()
    out = tmp_path_factory.mktemp("fidelity")
    table = study.study(out, toy=True, repeats=2, log=lambda *_: None)
    torch.set_num_threads(n)
    return out, table


@pytest.mark.slow   # a study at toy scale
def test_toy_study_writes_its_table_and_plots(toy):
    out, table = toy
    assert set(table["policy"]) == set(runs.POLICIES)
    assert len(table) == len(runs.POLICIES) * len(runs.METRICS)
    assert np.isfinite(table["error"]).all() and (table["repeats"] == 2).all()
    assert (table["real_lo"] <= table["real_mean"]).all()
    assert (table["real_mean"] <= table["real_hi"]).all()
    inside = (table["real_lo"] <= table["sim"]) & (table["sim"] <= table["real_hi"])
    assert (table["inside"] == inside).all()
    csv = pd.read_csv(out / "fidelity.csv")
    assert len(csv) == len(table)
    md = (out / "fidelity.md").read_text()
    assert all(f"| {p} |" in md for p in runs.POLICIES)
    assert "bias (mean signed error)" in md and "t-interval of the mean" in md
    assert (out / "cdfs.png").stat().st_size > 10_000
    info = json.loads((out / "fidelity.json").read_text())
    assert info["torch_threads"] == 1 and info["profile_meta"]["threads"] == "1"
    assert info["bias"]["profiled"]["goal"]["figures"] == 4 * len(runs.POLICIES)
    res = pd.read_csv(out / "residuals.csv")
    assert res["iterations"].sum() == table[table.metric == "num_iterations"]["real_mean"].sum() * 2
    assert (res["ratio_p50"] > 0).all() and res["time_share"].sum() == pytest.approx(1.0)
    assert {"decode b=1", "mixed"} <= set(res["composition"])
    streams = pd.read_csv(out / "decode_streams.csv")
    assert streams["iterations"].sum() == res.set_index("composition").loc["decode b=1",
                                                                             "iterations"]
    assert "their place in a run of them" in md
    host = pd.read_csv(out / "host_time.csv")
    assert (host["host_us_p50"] > 0).all() and (host["host_share"] < 0.5).all()
    assert info["clock"] == "cpu" and info["profile_meta"]["clock"] == "cpu"
    assert "measured / predicted" in md
    assert "step_jitter" in md and info["step_jitter"] > 0
    assert np.isfinite(table["error_jitter"]).all()
    assert (table["sim_jitter"] != table["sim"]).any()
    # the profile of means: the same points as the medians', other times, its statistic recorded
    assert np.isfinite(table["error_mean"]).all() and np.isfinite(table["error_mean_jitter"]).all()
    med, mean = (pd.read_parquet(out / f) for f in ("profile.parquet", "profile_mean.parquet"))
    assert (med["operator"] == mean["operator"]).all() and (med["time_s"] != mean["time_s"]).any()
    from sarathi_lab.profiler import profile_meta
    assert profile_meta(out / "profile_mean.parquet")["statistic"] == "mean"
    assert profile_meta(out / "profile.parquet")["statistic"] == "median"
    assert set(info["bias"]) == {"profiled", "jitter", "mean", "mean_jitter", "jitter_real",
                                 "speed"}
    # the speed spread is the profile parts', and its middle node (factor 1) is the profile
    # itself: the same run as the plain simulation
    assert info["speed_sigma"] == pytest.approx(np.std(info["speed_levels"], ddof=1))
    assert len(info["speed_levels"]) == 3
    middle = speed.SPEED_NODES // 2
    for p in runs.POLICIES:
        a = json.loads((out / "runs" / p / "sim" / "summary.json").read_text())
        b = json.loads((out / "runs" / p / "speed" / str(middle) / "summary.json").read_text())
        assert runs.figures(a) == runs.figures(b)
    goal = info["bias"]["profiled"]["goal"]
    assert goal["interval"]["bias"] == pytest.approx(goal["bias"])
    assert goal["interval"]["lo"] <= goal["bias"] <= goal["interval"]["hi"]
    assert len(goal["interval"]["per_round"]) == 2 and "bias_goal_90" in md
    # `--bias DIR` recomputes the same table from the kept runs' summaries
    again = kept.reread_bias(out)
    rows = md[:md.index("Error of the simulation")].splitlines()[4:]
    assert set(again.splitlines()[4:]) == {r for r in rows if r} and len(rows) > 5
    assert info["step_jitter_real"] > 0
    assert (pd.read_csv(out / "residuals_mean.csv")["iterations"].sum()
            == res["iterations"].sum())
    checks = pd.read_csv(out / "profile_check.csv")
    assert len(checks) > 0 and (checks["predicted_s"] > 0).all()


@pytest.mark.slow   # a study at toy scale
def test_toy_study_compares_like_with_like(toy):
    out, table = toy
    for policy in runs.POLICIES:
        real = pd.read_parquet(out / "runs" / policy / "real-0" / "iterations.parquet")
        sim = pd.read_parquet(out / "runs" / policy / "sim" / "iterations.parquet")
        got = table[(table.policy == policy) & (table.metric == "num_iterations")].iloc[0]
        real1 = pd.read_parquet(out / "runs" / policy / "real-1" / "iterations.parquet")
        assert got.real_mean == (len(real) + len(real1)) / 2 and got.sim == len(sim)
        assert (real["host_s"] > 0).all() and "host_s" not in sim
        # the real run's clock is the engine's virtual one, advanced by the executor's measured
        # step durations (on the thread's CPU time): each iteration starts when the previous one
        # ended (or later, when the engine waited for an arrival), and every token time of a
        # request is an iteration's end, so no time outside the measured steps reaches a TTFT
        # or TBT
        summary = json.loads((out / "runs" / policy / "real-0" / "summary.json").read_text())
        assert summary["config"]["executor"]["clock"] == "cpu"
        start, dur = real["start"].to_numpy(), real["duration"].to_numpy()
        gaps = start[1:] - (start[:-1] + dur[:-1])
        assert (gaps > -1e-9).all() and np.isclose(gaps, 0, atol=1e-9).mean() > 0.5
        ends = np.sort(start + dur)
        times = np.concatenate(pd.read_parquet(out / "runs" / policy / "real-0" /
                                               "requests.parquet")["token_times"].to_numpy())
        nearest = ends[np.clip(np.searchsorted(ends, times), 0, len(ends) - 1)]
        assert np.allclose(nearest, times, rtol=0, atol=1e-9)
        # both served the same trace
        rr = pd.read_parquet(out / "runs" / policy / "real-0" / "requests.parquet")
        rs = pd.read_parquet(out / "runs" / policy / "sim" / "requests.parquet")
        assert rr["num_prompt_tokens"].tolist() == rs["num_prompt_tokens"].tolist()
        assert (rr["status"] == "finished").all() and (rs["status"] == "finished").all()


@pytest.mark.slow   # a study at toy scale
def test_a_profile_of_another_model_stops_the_study_before_the_real_runs(toy, tmp_path):
    out, _ = toy
    scale = dict(runs.SCALES["toy"], model=["model=tiny-llama", "model.hidden_size=128"])
    runs.SCALES["wrong"] = scale
    try:
        with pytest.raises(ProfileError, match="n_embd: 64 in the profile, 128 in the run"):
            study.study(tmp_path, toy=True, profile=str(out / "profile.parquet"), repeats=2,
                    log=lambda *_: None, scale_name="wrong")
    finally:
        del runs.SCALES["wrong"]
    assert not (tmp_path / "runs").exists()


def test_jitter_sigma_by_hand(tmp_path):
    """ln(p90 / p10) / 2.5632 per row, the median over rows with a measured spread."""
    rows = pd.DataFrame({"time_s": [1.0, 2.0, 3.0, 1.0], "time_p10_s": [1.0, 1.0, 2.0, 0.0],
                         "time_p90_s": [np.e, np.e ** 2, 2.0, 1.0]})
    rows.to_parquet(tmp_path / "p.parquet")
    # rows: 1 / 2.5632, 2 / 2.5632, 0 (the last has no p10): median 1 / 2.5632
    assert jitter.jitter_sigma(tmp_path / "p.parquet") == pytest.approx(1 / 2.5632)
    rows.assign(time_p10_s=0.0).to_parquet(tmp_path / "q.parquet")
    with pytest.raises(ValueError, match="no row with a measured spread"):
        jitter.jitter_sigma(tmp_path / "q.parquet")


def test_part_levels_by_hand(tmp_path):
    """Three parts at speeds 1, 1.1 and 0.9 on the points of >= 0.1 ms: each point's median
    over the parts is part 0's, so the levels are 0, ln 1.1, ln 0.9. A point under 0.1 ms in
    some part (timer noise) is left out, however far it is off."""
    base = np.array([1e-3, 2e-3, 5e-3, 5e-5])
    paths = []
    for i, (f, odd) in enumerate(((1.0, 1.0), (1.1, 30.0), (0.9, 0.01))):
        t = base * f
        t[3] = base[3] * odd
        paths.append(tmp_path / f"{i}.parquet")
        pd.DataFrame({"time_s": t}).to_parquet(paths[-1])
    assert speed.part_levels(paths) == pytest.approx([0.0, np.log(1.1), np.log(0.9)])
    with pytest.raises(ValueError, match=">= 2 profile parts"):
        speed.part_levels(paths[:1])


def test_speed_nodes_integrate_a_lognormal():
    """E exp(sZ) = exp(s^2 / 2) and E (ln factor)^2 = s^2, to the quadrature's accuracy;
    a spread of 0 gives every node factor 1."""
    s = 0.12
    f, w = speed.speed_nodes(s)
    assert w.sum() == pytest.approx(1.0) and len(f) == speed.SPEED_NODES
    assert np.dot(w, f) == pytest.approx(np.exp(s * s / 2), rel=1e-9)
    assert np.dot(w, np.log(f) ** 2) == pytest.approx(s * s)
    assert np.allclose(speed.speed_nodes(0.0)[0], 1.0)
    with pytest.raises(ValueError, match="log-sd"):
        speed.speed_nodes(-0.1)


def test_scaled_profile_times_every_time_and_keeps_the_metadata(tmp_path):
    """What a machine 1.5x slower measures, as the quadrature over speeds reads it."""
    from sarathi_lab.profiler import COLUMNS, profile_meta
    from sarathi_lab.profiler.files import write
    rows = [{**dict.fromkeys(COLUMNS), "operator": "linear", "num_tokens": 4, "time_s": 2e-3,
             "time_p10_s": 1e-3, "time_p90_s": 3e-3, "repeats": 5}]
    src = write(rows, {"device": "cpu", "statistic": "median"}, tmp_path / "p.parquet")
    dst = speed.scaled_profile(src, 1.5, tmp_path / "q.parquet")
    q = pd.read_parquet(dst)
    assert q[["time_s", "time_p10_s", "time_p90_s"]].iloc[0].tolist() == \
        pytest.approx([3e-3, 1.5e-3, 4.5e-3])
    assert q["repeats"].iloc[0] == 5
    assert profile_meta(dst) == profile_meta(src)


def test_real_sigma_by_hand():
    """Log-ratios 0..9 in one composition, 5..14 in another: about their medians both are
    -4.5..4.5, each value twice; pandas' p90 and p10 of those 20 are 3.6 and -3.6, so the
    log-sd is 7.2 / 2.5632 (a shift of a whole composition is no spread)."""
    lr = np.concatenate([np.arange(10.0), np.arange(10.0) + 5])
    res = pd.DataFrame({"composition": ["a"] * 10 + ["b"] * 10, "predicted_s": 1e-3,
                        "measured_s": 1e-3 * np.exp(lr)})
    assert jitter.real_sigma(res) == pytest.approx(7.2 / 2.5632)


def test_busy_share_by_hand(tmp_path):
    """Iterations' time over the span from the first arrival to the last finish."""
    pd.DataFrame({"duration": [0.5, 1.0, 1.5]}).to_parquet(tmp_path / "iterations.parquet")
    pd.DataFrame({"arrival_time": [1.0, 2.0], "finish_time": [4.0, 7.0]}).to_parquet(
        tmp_path / "requests.parquet")
    assert runs.busy_share(tmp_path) == pytest.approx(3.0 / 6.0)


# --- host time: the iterations' host_s (Engine.step) ------------------------------------------

PRESET = dict(name="t", num_layers=1, hidden_size=32, intermediate_size=64, num_heads=4,
              num_kv_heads=2, head_dim=8, vocab_size=100, max_model_len=64)


def host_run(clock: str, fake: bool):
    """Six requests at t=0 on a random one-layer model under `executor.clock=CLOCK`; with
    `fake`, the executor's clock (steps and host time) is a counter moving 1 s per read. The
    iterations table."""
    from sarathi_lab.engine import Engine
    from sarathi_lab.metrics import iterations_table
    from sarathi_lab.request import Request
    from sarathi_lab.run import runner
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        policy, ex = runner.build({"executor": {"name": "torch", "device": "cpu",
                                                "kv_cache_gib": 0.01, "clock": clock},
                                   "model": PRESET, "scheduler": {"name": "sarathi"}})
        if fake:
            t = iter(range(10 ** 9))
            ex.now = ex.host_clock = lambda: float(next(t))
        rng = np.random.default_rng(0)
        reqs = [Request(i, 0.0, p, 4, prompt_token_ids=rng.integers(0, 100, p).tolist())
                for i, p in enumerate([5, 9, 13, 7, 3, 11])]
        engine = Engine(policy, ex)
        engine.run(reqs)
    finally:
        torch.set_num_threads(n)
    return iterations_table(engine.iteration_columns()), reqs


def test_host_time_on_a_counting_clock():
    """A clock that moves 1 s per read: the engine reads it before `schedule`, after the guard,
    after `execute` and after its bookkeeping (host_s = 1 + 1 = 2 s), the executor four times
    (a 3 s step). On the wall clock an iteration spans both (5 s) and its tokens come out after
    the schedule and the step (start + 4 s); on the CPU clock the engine's clock counts the step
    alone, as before, and host_s is recorded only."""
    wall, reqs = host_run("wall", fake=True)
    assert set(wall["duration"]) == {3.0} and set(wall["host_s"]) == {2.0}
    assert (np.diff(wall["start"]) == 5.0).all()
    ends = set((wall["start"] + 4.0).tolist())
    assert all(t in ends for r in reqs for t in r.token_times)
    cpu, reqs = host_run("cpu", fake=True)
    assert set(cpu["duration"]) == {3.0} and set(cpu["host_s"]) == {2.0}
    assert (np.diff(cpu["start"]) == 3.0).all()
    ends = set((cpu["start"] + 3.0).tolist())
    assert all(t in ends for r in reqs for t in r.token_times)


@pytest.mark.parametrize("clock", ["wall", "cpu"])
def test_host_time_on_the_real_clocks(clock):
    """Measured host time is positive and far below a step's whole time; the engine's clock
    advances by host_s + duration on the wall clock, by duration alone on the CPU clock (every
    request arrives at 0: no idle gap)."""
    it, _ = host_run(clock, fake=False)
    h = it["host_s"].to_numpy()
    assert len(it) >= 4 and (h > 0).all() and (h < 1.0).all()
    span = it["duration"].to_numpy()[:-1] + (h[:-1] if clock == "wall" else 0.0)
    assert np.allclose(np.diff(it["start"].to_numpy()), span, rtol=0, atol=1e-12)


def test_the_simulator_records_no_host_time():
    """The simulator's cost model prices whatever host time it models inside `duration`: its
    iterations table has no host_s column (the guard's recorded runs stay as they were)."""
    from studies import compose  # experiments/ (fidelity_lib put it on the path)

    from sarathi_lab.engine import Engine
    from sarathi_lab.metrics import iterations_table
    from sarathi_lab.request import Request
    from sarathi_lab.run import runner
    policy, ex = runner.build(compose(["model=tiny-llama", "executor=sim", "scheduler=sarathi"]))
    engine = Engine(policy, ex)
    engine.run([Request(0, 0.0, 8, 3)])
    assert "host_s" not in iterations_table(engine.iteration_columns())


@pytest.mark.parametrize("argv, says", [
    (["--warm-steps", "-1"], "--warm-steps=-1: must be >= 0"),
    (["--warm-steps", "4", "--profile", "p.parquet"], "not with --profile"),
])
def test_the_profilers_warm_steps_are_checked(argv, says):
    """`--warm-steps` (the profiler's decode steps before each timed decode batch, 0 for the
    profiles before it) is refused where negative or where no profile is measured."""
    with pytest.raises(SystemExit, match=says):
        F.main(argv)


NM = load_study("fidelity", "noise_memory.py")


def test_noise_of_by_hand():
    """ln(measured / predicted) by run: A 0.1, 0.3, 0.1, 0.3 (about its mean: -+0.1, lag-1
    correlation -1); B 0, 0.1, 0.2, 0.3, 0.4 and C 0, 0.2, 0.4, 0.6 (a trend: +1 each). The
    median correlation 1 is held below 1 (0.99); the spread is of the deviations from each
    run's mean pooled: squares 0.04 + 0.10 + 0.20 over 13 - 1: sd sqrt(0.34 / 12) = 0.16833."""
    logs = {"A": [0.1, 0.3, 0.1, 0.3], "B": [0, 0.1, 0.2, 0.3, 0.4], "C": [0, 0.2, 0.4, 0.6]}
    res = pd.DataFrame([{"run": r, "predicted_s": 0.002, "measured_s": 0.002 * np.exp(x)}
                        for r, xs in logs.items() for x in xs])
    sigma, rho = NM.noise_of(res)
    assert sigma == pytest.approx(np.sqrt(0.34 / 12)) and rho == 0.99
    sigma, rho = NM.noise_of(res[res.run == "A"])
    assert rho == 0.0 and sigma == pytest.approx(0.1 * np.sqrt(4 / 3))


@pytest.mark.slow   # the toy study (fixture `toy`)
def test_noise_memory_on_a_kept_toy_study(toy):
    out, _ = toy
    md = NM.main([str(out), "--seeds", "1"])
    assert (out / "noise_memory.md").read_text() == md
    for shape in ("independent", "with memory"):
        assert f"| {shape} | goal |" in md and f"| {shape} | latency |" in md
    assert all(f"| with memory | {p} |" in md for p in runs.POLICIES)
    # the study's own table is read from its runs as before: the new runs are not a variant
    assert set(kept.reread(out)["sims"]) == {"profiled", "jitter", "mean", "mean_jitter",
                                          "jitter_real", "speed"}


PO = load_study("fidelity", "pooled.py")


@pytest.mark.slow   # the toy study (fixture `toy`)
def test_pooled_rounds_of_kept_toy_studies(toy):
    """Two studies of 2 rounds each: no line per study, one through their 4 rounds, which is
    `matched_bias` of the rounds' own biases and levels; every variant's rounds are read
    against its own profile's priced iterations."""
    out, _ = toy
    info = json.loads((out / "fidelity.json").read_text())
    assert {k: len(v) for k, v in info["round_levels"].items()} == {"median": 2, "mean": 2}
    assert "matched" not in info["bias"]["profiled"]["goal"]   # 2 rounds: no line
    t = PO.pooled([out, out])
    per = info["bias"]["profiled"]["goal"]["interval"]["per_round"]
    want = bias.matched_bias(per * 2, info["round_levels"]["median"] * 2)
    assert t["at_profile_speed"].tolist() == ["", "", report.matched_text(want)]
    assert t["rounds"].tolist() == [2, 2, 4]
    mean = PO.pooled([out, out], "mean")
    per = info["bias"]["mean"]["goal"]["interval"]["per_round"]
    assert mean["at_profile_speed"].iloc[-1] == report.matched_text(
        bias.matched_bias(per * 2, info["round_levels"]["mean"] * 2))
    assert "| all | 4 |" in PO.main([str(out), str(out)])
    with pytest.raises(SystemExit, match="no kept simulation 'nope'"):
        PO.main([str(out), "--variant", "nope"])


SS = load_study("fidelity", "speed_spread.py")


@pytest.mark.slow   # the toy study (fixture `toy`)
def test_speed_spread_on_a_kept_toy_study(toy, tmp_path):
    """speed_spread.py recomputes, from the kept parts and runs, the study's own "speed"
    variant: the same spread, the same simulations, the same bias."""
    out, _ = toy
    info = json.loads((out / "fidelity.json").read_text())
    md = SS.main([str(out)])
    assert (out / "speed_spread.md").read_text() == md
    assert f"log-sd {info['speed_sigma']:.3f}" in md
    goal = info["bias"]["speed"]["goal"]
    assert f"| speed | goal | {goal['bias']:+.1%} |" in md
    assert f"| profiled | goal | {info['bias']['profiled']['goal']['bias']:+.1%} |" in md
    with pytest.raises(SystemExit, match="not a kept fidelity study"):
        SS.main([str(tmp_path)])


@pytest.mark.slow   # the toy study (fixture `toy`)
def test_bias_table_from_the_command_line(toy, capsys):
    """`run.py --bias DIR` prints the kept study's bias table and runs nothing."""
    out, _ = toy
    F.main(["--bias", str(out)])
    printed = capsys.readouterr().out
    assert printed.strip() == kept.reread_bias(out).strip() and "| profiled |" in printed
