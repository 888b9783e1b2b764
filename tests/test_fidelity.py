"""The fidelity study (experiments/fidelity/run.py): its comparison computed by hand, and the
whole study at toy scale (profile, real runs, simulated runs, table, plots) in seconds."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from sarathi_lab.costmodels.profiles import ProfileError

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("fidelity_run",
                                              ROOT / "experiments" / "fidelity" / "run.py")
F = importlib.util.module_from_spec(spec)
spec.loader.exec_module(F)


def figs(v):
    return {F.metric_name(m, q): v for m, q in F.METRICS}


def test_compare_by_hand():
    real = {"orca": [figs(1.0), figs(3.0), figs(2.0)]}
    sim = {"orca": figs(2.5)}
    t = F.compare(real, sim)
    assert len(t) == len(F.METRICS) and set(t["policy"]) == {"orca"}
    row = t[t.metric == "ttft_p99"].iloc[0]
    assert row.real_median == 2.0 and row.real_min == 1.0 and row.real_max == 3.0
    assert row.real_spread == pytest.approx((3 - 1) / 2)
    assert row.error == pytest.approx(2.5 / 2.0 - 1) and row.repeats == 3
    md = F.markdown(t)
    assert "| orca | +25.0% (100.0%) |" in md


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    n = torch.get_num_threads()
    out = tmp_path_factory.mktemp("fidelity")
    table = F.study(out, toy=True, repeats=1, log=lambda *_: None)
    torch.set_num_threads(n)
    return out, table


@pytest.mark.slow   # a study at toy scale
def test_toy_study_writes_its_table_and_plots(toy):
    out, table = toy
    assert set(table["policy"]) == set(F.POLICIES)
    assert len(table) == len(F.POLICIES) * len(F.METRICS)
    assert np.isfinite(table["error"]).all() and (table["real_spread"] == 0).all()  # 1 repeat
    csv = pd.read_csv(out / "fidelity.csv")
    assert len(csv) == len(table)
    md = (out / "fidelity.md").read_text()
    assert all(f"| {p} |" in md for p in F.POLICIES)
    assert (out / "cdfs.png").stat().st_size > 10_000
    info = json.loads((out / "fidelity.json").read_text())
    assert info["torch_threads"] == 1 and info["profile_meta"]["threads"] == "1"
    ratios = pd.read_csv(out / "decode_ratios.csv")
    assert set(ratios["policy"]) <= set(F.POLICIES) and (ratios["p50"] > 0).all()
    assert "p50_b1" in ratios and "p50_b9+" in ratios
    assert info["clock"] == "cpu" and info["profile_meta"]["clock"] == "cpu"
    assert "measured / predicted" in md
    assert "step_jitter" in md and info["step_jitter"] > 0
    assert np.isfinite(table["error_jitter"]).all()
    assert (table["sim_jitter"] != table["sim"]).any()
    checks = pd.read_csv(out / "profile_check.csv")
    assert len(checks) > 0 and (checks["predicted_s"] > 0).all()


@pytest.mark.slow   # a study at toy scale
def test_toy_study_compares_like_with_like(toy):
    out, table = toy
    for policy in F.POLICIES:
        real = pd.read_parquet(out / "runs" / policy / "real-0" / "iterations.parquet")
        sim = pd.read_parquet(out / "runs" / policy / "sim" / "iterations.parquet")
        got = table[(table.policy == policy) & (table.metric == "num_iterations")].iloc[0]
        assert got.real_median == len(real) and got.sim == len(sim)
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


def test_decode_ratios_use_the_batches_mean_context(tmp_path):
    class Cost:   # 1 ms per request + 1 us per token of context
        def iteration_time(self, prefills, decodes, sampled):
            assert not prefills and sampled == len(decodes)
            return 1e-3 * len(decodes) + 1e-6 * sum(decodes)
    # two decodes at contexts 99 and 199 store 100 + 200 tokens after the step: mean 149
    pd.DataFrame({"prefill_tokens": [0, 64], "num_requests": [2, 1], "kv_tokens_stored": [300, 64],
                  "duration": [2 * (2e-3 + 298e-6), 1.0]}).to_parquet(tmp_path / "iterations.parquet")
    assert F.decode_ratios([tmp_path], Cost()).tolist() == pytest.approx([2.0])


@pytest.mark.slow   # a study at toy scale
def test_a_profile_of_another_model_stops_the_study_before_the_real_runs(toy, tmp_path):
    out, _ = toy
    scale = dict(F.SCALES["toy"], model=["model=tiny-llama", "model.hidden_size=128"])
    F.SCALES["wrong"] = scale
    try:
        with pytest.raises(ProfileError, match="n_embd: 64 in the profile, 128 in the run"):
            F.study(tmp_path, toy=True, profile=str(out / "profile.parquet"), repeats=1,
                    log=lambda *_: None, scale_name="wrong")
    finally:
        del F.SCALES["wrong"]
    assert not (tmp_path / "runs").exists()


def test_jitter_sigma_by_hand(tmp_path):
    """ln(p90 / p10) / 2.5632 per row, the median over rows with a measured spread."""
    rows = pd.DataFrame({"time_s": [1.0, 2.0, 3.0, 1.0], "time_p10_s": [1.0, 1.0, 2.0, 0.0],
                         "time_p90_s": [np.e, np.e ** 2, 2.0, 1.0]})
    rows.to_parquet(tmp_path / "p.parquet")
    # rows: 1 / 2.5632, 2 / 2.5632, 0 (the last has no p10): median 1 / 2.5632
    assert F.jitter_sigma(tmp_path / "p.parquet") == pytest.approx(1 / 2.5632)
    rows.assign(time_p10_s=0.0).to_parquet(tmp_path / "q.parquet")
    with pytest.raises(ValueError, match="no row with a measured spread"):
        F.jitter_sigma(tmp_path / "q.parquet")


def test_busy_share_by_hand(tmp_path):
    """Iterations' time over the span from the first arrival to the last finish."""
    pd.DataFrame({"duration": [0.5, 1.0, 1.5]}).to_parquet(tmp_path / "iterations.parquet")
    pd.DataFrame({"arrival_time": [1.0, 2.0], "finish_time": [4.0, 7.0]}).to_parquet(
        tmp_path / "requests.parquet")
    assert F.busy_share(tmp_path) == pytest.approx(3.0 / 6.0)


# --- host time: the iterations' host_s (Engine.step) ------------------------------------------

PRESET = dict(name="t", num_layers=1, hidden_size=32, intermediate_size=64, num_heads=4,
              num_kv_heads=2, head_dim=8, vocab_size=100, max_model_len=64)


def host_run(clock: str, fake: bool):
    """Six requests at t=0 on a random one-layer model under `executor.clock=CLOCK`; with
    `fake`, the executor's clock (steps and host time) is a counter moving 1 s per read. The
    iterations table."""
    from sarathi_lab import runner
    from sarathi_lab.engine import Engine
    from sarathi_lab.metrics import iterations_table
    from sarathi_lab.request import Request
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
    from sarathi_lab import runner
    from sarathi_lab.engine import Engine
    from sarathi_lab.metrics import iterations_table
    from sarathi_lab.request import Request
    policy, ex = runner.build(F.compose(["model=tiny-llama", "executor=sim",
                                         "scheduler=sarathi"]))
    engine = Engine(policy, ex)
    engine.run([Request(0, 0.0, 8, 3)])
    assert "host_s" not in iterations_table(engine.iteration_columns())
