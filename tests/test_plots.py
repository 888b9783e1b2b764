"""The plots stay readable, checked on the figures' artists: identical runs drawn once, small
multiples past max_lines, seeds as the mean with a band, log axes with at least three labels,
legends outside the data, the load plot's reference only where it holds, capacity bars with one
number format and a log scale. Tables are built by hand over hand-written request tables."""
import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from sarathi_lab import plots
from sarathi_lab.plots.lines import Line, _panels, choose_split
from sarathi_lab.plots.style import _labelled_digits
from sarathi_lab.report import labelled, t_quantile

T3 = t_quantile(0.975, 3)


def runs(tmp_path, specs, keys):
    """A run table (as run_table makes it) over runs written by hand: each spec has `policy`,
    its settings, optional `seed`, `ttft` (one value per request) and any metric columns."""
    rows = []
    for i, s in enumerate(specs):
        d = tmp_path / f"run{i}"
        d.mkdir(parents=True)
        ttft = np.asarray(s.pop("ttft"), dtype=float)
        # a request's tokens: its first at ttft, then one gap of `gap` s
        gap = s.pop("gap", 0.02)
        pd.DataFrame({"ttft": ttft, "token_times": [[t, t + gap] for t in ttft]}).to_parquet(
            d / "requests.parquet")
        rows.append({"run_dir": str(d), "model": "m", "hardware": "h", "trace": "t", **s})
    df = pd.DataFrame(rows)
    df.attrs["override_keys"] = keys
    return labelled(df)


def data_lines(ax):
    return [ln for ln in ax.get_lines() if ln.get_gid() == plots.DATA_GID]


def fig_axes(fig):
    return [ax for ax in fig.axes if data_lines(ax) or ax.patches]


def test_identical_runs_are_drawn_once_and_named_together(tmp_path):
    same = [0.1, 0.2, 0.4, 0.8]
    t = runs(tmp_path, [
        {"policy": "vllm", "scheduler.max_num_batched_tokens": 4096, "ttft": [0.3, 0.5, 0.9, 2.0]},
        {"policy": "sarathi", "scheduler.max_num_batched_tokens": np.nan,
         "scheduler.token_budget": 4096, "ttft": same},
        {"policy": "sarathi", "scheduler.max_num_batched_tokens": np.nan,
         "scheduler.token_budget": 8192, "ttft": same}],
        ["scheduler", "scheduler.max_num_batched_tokens", "scheduler.token_budget"])
    fig, data = plots.ttft_cdf.draw(t)
    (ax,) = fig.axes
    lines = data_lines(ax)
    assert len(lines) == 2                      # three runs, two different CDFs
    legend = [x.get_text() for x in fig.legends[0].get_texts()]
    assert "sarathi (token_budget=4096) = sarathi (token_budget=8192)" in legend
    # the data still has every run, and says what each is drawn as
    assert set(data["label"]) == set(t["label"])
    both = data[data["label"].str.startswith("sarathi")]
    assert both["drawn_as"].nunique() == 1
    drawn = next(ln for ln in lines if ln.get_label().startswith("sarathi"))
    assert np.allclose(drawn.get_xdata(), np.quantile(same, plots.QUANTILES))


def test_many_lines_become_small_multiples(tmp_path):
    """vllm at 3 loads and sarathi at 4 budgets x 3 loads: 15 lines; split by load (3 panels
    of 5: vllm and sarathi's 4 budgets), not by policy (12 sarathi lines on one axes)."""
    specs = []
    rng = np.random.default_rng(0)
    for qps in (1, 2, 3):
        specs.append({"policy": "vllm", "scheduler.token_budget": np.nan, "trace.qps": qps,
                      "ttft": rng.exponential(qps, 20)})
        for b in (128, 256, 512, 1024):
            specs.append({"policy": "sarathi", "scheduler.token_budget": b, "trace.qps": qps,
                          "ttft": rng.exponential(qps * b / 256, 20)})
    t = runs(tmp_path, specs, ["scheduler", "scheduler.token_budget", "trace.qps"])
    fig, data = plots.ttft_cdf.draw(t, max_lines=8)
    axes = fig_axes(fig)
    assert len(axes) == 3
    assert sorted(ax.get_title() for ax in axes) == ["qps=1", "qps=2", "qps=3"]
    assert [len(data_lines(ax)) for ax in axes] == [5, 5, 5]
    assert set(data["panel"]) == {"qps=1", "qps=2", "qps=3"}
    # names leave out the panel's setting; one legend for all panels, each name once
    legend = [x.get_text() for x in fig.legends[0].get_texts()]
    assert legend == ["vllm", "sarathi (token_budget=128)", "sarathi (token_budget=256)",
                      "sarathi (token_budget=512)", "sarathi (token_budget=1024)"]
    # and a name has one colour in every panel
    colours = {}
    for ax in axes:
        for ln in data_lines(ax):
            colours.setdefault(ln.get_label(), set()).add(ln.get_color())
    assert all(len(c) == 1 for c in colours.values())
    # max_lines large enough: one axes with all 15
    fig, _ = plots.ttft_cdf.draw(t, max_lines=15)
    assert [len(data_lines(ax)) for ax in fig_axes(fig)] == [15]
    # the TBT CDF splits the same way, a row (CDF, tail) per panel
    fig, _ = plots.tbt_cdf.draw(t, max_lines=8)
    assert len(fig_axes(fig)) == 6


def _line(policy, **settings):
    return Line(policy, settings, pd.DataFrame(), signature=(np.array([len(settings),
                                                                      hash(repr(settings))]),))


def test_split_choice_by_hand():
    lines = [_line("vllm", qps=q) for q in (1, 2)] + \
        [_line("sarathi", qps=q, budget=b) for q in (1, 2) for b in (1, 2, 3, 4)]
    keys = ["policy", "qps", "budget"]
    # 10 lines; policy gives 2 and 8 -> fits 8; qps gives 5 and 5 -> fits; budget broadcasts
    # vllm (no budget) into 4 panels of 4: fewest panels wins, policy before qps on a tie
    assert choose_split(lines, keys, 8) == ("policy",)
    assert choose_split(lines, keys, 5) == ("qps",)
    assert choose_split(lines, keys, 4) == ("budget",)
    # by two keys: (policy, budget) gives vllm a panel of its own (2) and sarathi 4 panels of
    # 2: 5 panels; (qps, budget) 8 panels of 2 (sarathi and vllm at that load)
    assert choose_split(lines, keys, 2) == ("policy", "budget")
    panels = _panels(lines, ("policy", "budget"))
    assert [len(p) for p in panels.values()] == [2, 2, 2, 2, 2]
    assert {id(ln) for p in panels.values() for ln in p} == {id(ln) for ln in lines}
    assert choose_split(lines, keys, 10) == ()
    # nothing fits 1 a panel: the split with the smallest largest panel
    assert choose_split(lines, keys, 1) == ("policy", "budget")


def test_seeds_are_one_line_with_a_band(tmp_path):
    """Three seeds of one configuration: the curve is the mean of the seeds' quantiles, the
    band their min and max; four seeds: the band is the 95% t interval."""
    seeds = [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [3.0, 3.0, 3.0], [0.0, 1.0, 2.0]]
    specs = [{"policy": "sarathi", "seed": s, "ttft": v} for s, v in enumerate(seeds[:3])]
    t = runs(tmp_path / "three", specs, ["scheduler", "seed"])
    assert t["config"].nunique() == 1 and t["label"].nunique() == 3
    fig, data = plots.ttft_cdf.draw(t)
    (ax,) = fig.axes
    assert len(data_lines(ax)) == 1 and len(ax.collections) == 1     # the band
    med = data[np.isclose(data["q"], 0.5)].iloc[0]
    assert med["n_seeds"] == 3
    assert med["value"] == pytest.approx((2 + 4 + 3) / 3)
    assert (med["lo"], med["hi"]) == (2.0, 4.0)
    top = data[data["q"] == 1.0].iloc[0]
    assert (top["value"], top["lo"], top["hi"]) == pytest.approx((4.0, 3.0, 6.0))
    specs = [{"policy": "sarathi", "seed": s, "ttft": v} for s, v in enumerate(seeds)]
    t4 = runs(tmp_path / "four", specs, ["scheduler", "seed"])
    _, data = plots.ttft_cdf.draw(t4)
    med = data[np.isclose(data["q"], 0.5)].iloc[0]
    v = np.array([2.0, 4.0, 3.0, 1.0])          # the seeds' medians
    half = T3 * v.std(ddof=1) / 2
    assert (med["value"], med["lo"], med["hi"]) == pytest.approx((2.5, 2.5 - half, 2.5 + half))


def test_log_axes_carry_three_plain_labels():
    assert _labelled_digits(10, 10_000) == set()         # 10, 100, 1000, 10000
    assert _labelled_digits(0.15, 70) == {2, 5}           # 1 and 10 only: add 0.2, 0.5, ...
    assert _labelled_digits(0.3, 0.9) == set(range(2, 10))
    from matplotlib.figure import Figure
    for lo, hi in ((0.15, 70), (0.3, 0.9), (12, 700), (0.02, 300)):
        fig = Figure()
        ax = fig.subplots()
        ax.plot([lo, hi], [0, 1])
        ax.set_xscale("log")
        plots.plain_log(ax)
        fig.draw_without_rendering()
        a, b = ax.get_xlim()
        shown = [t.get_text() for t in ax.xaxis.get_ticklabels(which="both")
                 if t.get_text() and a <= t.get_position()[0] <= b]
        assert len(shown) >= 3, (lo, hi, shown)
        assert all("times" not in s and "^" not in s for s in shown)   # plain, not 10^x


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_legends_sit_outside_the_axes(tmp_path):
    rng = np.random.default_rng(1)
    specs = [{"policy": p, "trace.qps": q, "ttft": rng.exponential(1, 30), "gap": 0.01 * q,
              "slo_p99_tbt": 0.05}
             for p in ("vllm", "sarathi") for q in (1, 2, 3)]
    t = runs(tmp_path, specs, ["scheduler", "trace.qps"])
    for plot in (plots.ttft_cdf, plots.tbt_cdf):
        fig, _ = plot.draw(t)
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        r = canvas.get_renderer()
        assert fig.legends
        for leg in fig.legends:
            box = leg.get_window_extent(r)
            assert not any(_overlap(box, ax.get_window_extent(r)) for ax in fig.axes)
        assert not any(ax.get_legend() for ax in fig.axes)


def _load_table(tmp_path, makespans, offered=(1.0, 2.0), n=100):
    specs = [{"policy": "sarathi", "trace.qps": q, "offered_qps": q, "ttft": [0.1],
              "num_requests": n, "makespan_s": m, "slo_goodput_rps": 0.9 * n / m,
              "slo_attainment": 0.9, "throughput_rps": n / m}
             for q, m in zip(offered, makespans)]
    return runs(tmp_path, specs, ["scheduler", "trace.qps"])


def test_the_goodput_diagonal_is_drawn_only_where_it_holds(tmp_path):
    # 100 requests at 1 and 2 req/s: makespans 140 s and 90 s (the drain after the last
    # arrival): had every request met the SLO, goodput would be 0.71 and 1.11, not 1 and 2
    t = _load_table(tmp_path / "short", (140.0, 90.0))
    assert not plots.diagonal_holds(t)
    fig, data = plots.load_curves.draw(t)
    g_ax = fig.axes[0]
    assert data.attrs["reference"] == "ceiling"
    assert not [ln for ln in g_ax.get_lines() if "offered load" in ln.get_label()]
    (marks,) = [ln for ln in g_ax.get_lines() if ln.get_gid() == "ceiling"]
    assert np.allclose(marks.get_ydata(), [100 / 140, 100 / 90])
    assert np.allclose(data["ceiling_rps"], [100 / 140, 100 / 90])
    # a long trace: requests / makespan within 5% of the offered load -> the diagonal
    t = _load_table(tmp_path / "long", (102.0, 50.5))
    assert plots.diagonal_holds(t)
    fig, data = plots.load_curves.draw(t)
    assert data.attrs["reference"] == "diagonal"
    assert [ln for ln in fig.axes[0].get_lines() if "offered load" in ln.get_label()]
    assert not [ln for ln in fig.axes[0].get_lines() if ln.get_gid() == "ceiling"]


def _capacity(values, seeds=None):
    rows = []
    for i, (policy, v) in enumerate(values):
        rows.append({"run_dir": f"/x/{policy}{i}", "policy": policy, "slo": "s",
                     "criterion": "tbt", "source": "Sarathi-Serve", "capacity_qps": v,
                     "fails_at_qps": v * 1.05, "bracketed": True, "probes": 5, "model": "m",
                     "hardware": "h", "trace": "t", "num_requests": 10,
                     **({"seed": seeds[i]} if seeds else {})})
    df = pd.DataFrame(rows)
    df.attrs["override_keys"] = ["scheduler"] + (["seed"] if seeds else [])
    return labelled(df)


def test_capacity_bars_one_number_format_and_log_scale():
    assert [plots.sig(v) for v in (0.0283203, 1.1, 2.1, 2.48, 0.953, 148.2, 1234.5)] == \
        ["0.0283", "1.10", "2.10", "2.48", "0.953", "148", "1234"]
    cap = _capacity([("request_level", 0.0283), ("vllm", 1.1), ("sarathi", 2.48)])
    fig, data = plots.capacity_bars.draw(cap)                  # 2.48 / 0.0283 > 20: log
    (ax,) = fig.axes
    assert data.attrs["scale"] == "log" and ax.get_yscale() == "log"
    assert sorted(t.get_text() for t in ax.texts) == ["0.0283", "1.10", "2.48"]
    fig, data = plots.capacity_bars.draw(cap, scale="linear")
    assert fig.axes[0].get_yscale() == "linear"
    fig, data = plots.capacity_bars.draw(_capacity([("vllm", 1.1), ("sarathi", 2.48)]))
    assert fig.axes[0].get_yscale() == "linear"                 # within 20x: linear
    with pytest.raises(ValueError, match="capacity scale"):
        plots.capacity_bars.draw(cap, scale="logarithmic")
    # seeds: the bar is the mean, the error bar the min-max of 3 seeds
    seeded = _capacity([("vllm", 1.0), ("vllm", 1.3), ("vllm", 1.6)], seeds=[0, 1, 2])
    fig, data = plots.capacity_bars.draw(seeded)
    (row,) = data.itertuples()
    assert (row.capacity_qps, row.capacity_lo, row.capacity_hi, row.n_seeds) == \
        pytest.approx((1.3, 1.0, 1.6, 3))
    assert [t.get_text() for t in fig.axes[0].texts] == ["1.30"]


def test_plots_are_deterministic(tmp_path):
    rng = np.random.default_rng(2)
    specs = [{"policy": p, "trace.qps": q, "ttft": rng.exponential(1, 30)}
             for p in ("vllm", "sarathi") for q in (1, 2)]
    t = runs(tmp_path, specs, ["scheduler", "trace.qps"])
    a = plots.ttft_cdf(t, tmp_path / "a", ("png", "pdf"))[0]
    b = plots.ttft_cdf(t, tmp_path / "b", ("png", "pdf"))[0]
    for x, y in zip(a, b):
        assert x.read_bytes() == y.read_bytes(), x.name
