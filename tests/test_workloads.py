"""Workload mixes (traces/mixes.py) and bursty arrivals: rates and counts split by hand, service
columns, tenants, independence of the components' streams, on/off bursts, a timestamped trace
re-timed, the config group and the CLI."""
import json

import numpy as np
import pandas as pd
import pytest
from helpers import cli, composed

from sarathi_lab.settings import ConfigError, parse
from sarathi_lab.traces import (
    MixConfig,
    build_mix,
    build_trace,
    load_trace,
    synthetic_trace,
    to_requests,
)


def mix(components, **kw):
    return parse(MixConfig, {"num_requests": 10, "components": components, **kw}, "trace")


def test_rates_and_counts_by_hand():
    # shares 3:1 of 4 req/s -> 3 and 1 req/s; 10 requests -> 7.5 and 2.5 -> 7 and 2, and the one
    # left over to the larger remainder (a tie: the first listed)
    m = mix({"a": {"trace": "sharegpt", "share": 3}, "b": {"trace": "arxiv", "share": 1}},
            qps=4.0)
    assert m.rates() == {"a": 3.0, "b": 1.0}
    assert m.counts() == {"a": 8, "b": 2}
    # qps per component: the total is their sum; a mix qps scales them all
    comps = {"a": {"trace": "sharegpt", "qps": 1.0}, "b": {"trace": "arxiv", "qps": 3.0}}
    assert mix(comps).rates() == {"a": 1.0, "b": 3.0}
    assert mix(comps, qps=8.0).rates() == {"a": 2.0, "b": 6.0}
    assert mix(comps, num_requests=7).counts() == {"a": 2, "b": 5}   # 1.75, 5.25


@pytest.mark.parametrize("components, kw, match", [
    ({}, {}, "trace.components: a mix needs at least one"),
    ({"a": {"trace": "sharegpt"}}, {"qps": 1.0}, "give exactly one of share and qps"),
    ({"a": {"trace": "sharegpt", "share": 1, "qps": 1.0}}, {"qps": 1.0}, "exactly one"),
    ({"a": {"trace": "sharegpt", "share": 1}}, {}, "trace.qps: the components give shares"),
    ({"a": {"trace": "sharegpt", "share": 1}, "b": {"trace": "arxiv", "qps": 1.0}},
     {"qps": 2.0}, "trace.components.b.qps: components.a gives a share"),
    ({"a": {"share": 1}}, {"qps": 1.0}, "trace.components.a.prompt_len: a component without"),
    ({"a": {"trace": "sharegpt", "share": 1, "prompt_len": 5}}, {"qps": 1.0},
     "prompt_len=5: read only without a trace"),
    ({"a": {"trace": "sharegpt", "share": 1, "tenants": {"x": 0}}}, {"qps": 1.0},
     "every share must be a number > 0"),
    ({"a": {"trace": "sharegpt", "share": 1, "tenants": 0}}, {"qps": 1.0}, "tenants=0"),
    ({"a": {"trace": "sharegpt", "share": 1, "arrival": "onoff"}}, {"qps": 1.0},
     "trace.components.a.on_s=None: arrival=onoff needs it"),
    ({"a": {"trace": "azure_conv", "share": 1, "arrival": "trace", "cv": 2.0}}, {"qps": 1.0},
     "arrival=trace: keeps the trace's own gaps"),
    ({"a": {"trace": "sharegpt", "share": 1, "sahre": 1}}, {"qps": 1.0},
     "trace.components.a.sahre: not a setting of mix component 'a'"),
    ({"a": 5}, {"qps": 1.0}, "trace.components.a=5: must be a mapping"),
])
def test_bad_mix(components, kw, match):
    with pytest.raises(ConfigError, match=match):
        mix(components, **kw)


def test_service_columns_and_tenants():
    m = mix({"chat": {"trace": "sharegpt", "share": 1, "tenants": {"x": 3, "y": 1},
                      "deadline": 2.0},
             "job": {"prompt_len": 100, "output_len": 10, "share": 1, "slo_class": "batch",
                     "priority": 2, "tenants": 3}}, qps=10.0, num_requests=4000, seed=4)
    df = build_mix(m)
    assert len(df) == 4000 and (np.diff(df["arrival_time"]) >= 0).all()
    chat, job = df[df["slo_class"] == "chat"], df[df["slo_class"] == "batch"]
    assert len(chat) == len(job) == 2000
    assert (chat["priority"] == 0).all() and (job["priority"] == 2).all()
    assert (chat["deadline"] == 2.0).all() and job["deadline"].isna().all()
    assert (job["num_prompt_tokens"] == 100).all() and (job["num_output_tokens"] == 10).all()
    assert set(job["tenant"]) == {"job0", "job1", "job2"}
    share_x = (chat["tenant"] == "x").mean()
    assert share_x == pytest.approx(0.75, abs=0.03)   # 3:1, sd 0.01
    reqs = to_requests(df)
    r = next(r for r in reqs if r.slo_class == "chat")
    assert r.deadline == r.arrival_time + 2.0 and r.tenant in ("x", "y")


def test_no_tenants_means_the_default_tenant():
    df = build_mix(mix({"a": {"trace": "sharegpt", "share": 1}}, qps=1.0))
    assert set(df["tenant"]) == {"default"} and set(df["slo_class"]) == {"a"}


def test_components_have_streams_of_their_own():
    one = build_mix(mix({"a": {"trace": "sharegpt", "qps": 1.0}}, num_requests=10, seed=2))
    two = build_mix(mix({"a": {"trace": "sharegpt", "qps": 1.0},
                         "b": {"trace": "arxiv", "qps": 1.0}}, num_requests=20, seed=2))
    a = two[two["slo_class"] == "a"].reset_index(drop=True)
    pd.testing.assert_frame_equal(one, a, check_like=True)
    other = build_mix(mix({"a": {"trace": "sharegpt", "qps": 1.0}}, num_requests=10, seed=3))
    assert not other["arrival_time"].equals(one["arrival_time"])


def test_a_trace_arrival_keeps_the_traces_own_gaps_at_the_rate():
    df = build_mix(mix({"az": {"trace": "azure_conv", "qps": 2.0, "arrival": "trace"}},
                       num_requests=50))
    own = load_trace("azure_conv", num_requests=50)["arrival_time"].to_numpy()
    t = df["arrival_time"].to_numpy()
    assert (len(t) - 1) / t[-1] == pytest.approx(2.0)
    np.testing.assert_allclose(t, own * (t[-1] / own[-1]))
    with pytest.raises(ValueError, match="arrival=trace needs a trace with timestamps"):
        build_mix(mix({"x": {"trace": "sharegpt", "qps": 2.0, "arrival": "trace"}}))


def test_onoff_arrivals_only_during_bursts_at_the_mean_rate():
    df = synthetic_trace(4000, 2.0, arrival="onoff", burst=(10.0, 30.0), prompt_len=5,
                         output_len=5, seed=1)
    t = df["arrival_time"].to_numpy()
    assert t[0] == 0.0 and (np.diff(t) >= 0).all()
    assert (np.mod(t, 40.0) < 10.0).all()              # nothing in the 30 s off periods
    assert (len(t) - 1) / t[-1] == pytest.approx(2.0, rel=0.05)
    # while on, Poisson at 2 x 40 / 10 = 8 req/s: gaps inside a burst average 1/8 s
    gaps = np.diff(t)
    assert gaps[gaps < 10].mean() == pytest.approx(1 / 8, rel=0.05)


def test_onoff_in_a_trace_config():
    cfg = {"name": "x", "path": "sharegpt", "num_requests": 300, "qps": 1.0,
           "arrival": "onoff", "on_s": 5.0, "off_s": 5.0, "seed": 0}
    t = build_trace(cfg)["arrival_time"].to_numpy()
    assert (np.mod(t, 10.0) < 5.0).all()
    with pytest.raises(ConfigError, match="trace.on_s=5.0: read only with arrival=onoff"):
        build_trace({**cfg, "arrival": "poisson"})
    with pytest.raises(ConfigError, match="trace.off_s=None: arrival=onoff needs it"):
        build_trace({**cfg, "off_s": None})
    with pytest.raises(ValueError, match="burst"):
        load_trace("sharegpt", qps=1.0, burst=(1.0, 1.0))
    # a timestamped trace keeps its own times: another arrival process is not read
    with pytest.raises(ValueError, match="has its own arrival times, so arrival='onoff'"):
        build_trace({**cfg, "path": "azure_conv"})


def test_the_mix_preset_builds():
    c = composed("trace=mix", "seed=3")
    df = build_trace(c["trace"])
    assert len(df) == c["trace"]["num_requests"] == 1000
    assert df.attrs["counts"] == {"chat": 600, "heavy": 250, "batch": 150}
    assert set(df["slo_class"]) == {"interactive", "batch"}
    assert set(df["tenant"]) == {f"chat{i}" for i in range(9)} | {"heavy", "batch"}
    # the heavy tenant's prompts (arXiv) are longer than chat's (ShareGPT)
    by = df.groupby("tenant")["num_prompt_tokens"].mean()
    assert by["heavy"] > 2 * by[[f"chat{i}" for i in range(9)]].mean()


@pytest.mark.slow   # a CLI subprocess
def test_cli_mix_with_per_class_slos(tmp_path):
    r = cli("trace=mix", "slo=chat-batch", "trace.num_requests=60", "trace.qps=1.0",
            f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(s["classes"]) == {"interactive", "batch"}
    assert s["classes"]["interactive"]["num_requests"] + s["classes"]["batch"]["num_requests"] == 60
    assert "heavy" in s["tenants"] and s["fairness"]["num_tenants"] == len(s["tenants"])
    assert "SLO class" in r.stdout and "Jain's index" in r.stdout
    rq = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert {"tenant", "slo_class", "priority", "deadline"} <= set(rq.columns)
