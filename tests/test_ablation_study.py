"""The ablation study: the chunking-only plug-in (Sarathi-Serve's simple_chunking) scheduled by
hand, and the study at toy scale through the CLI's dotted-path plug-in loading."""
import json
import os

import pandas as pd
import pytest
from helpers import INSTANT_HW, TINY_MODEL
from study_scripts import REPO, load_study

from sarathi_lab.engine import Engine
from sarathi_lab.metrics import iterations_table
from sarathi_lab.request import Request
from sarathi_lab.run.runner import build

pytestmark = pytest.mark.slow   # a study at toy scale

approx = pytest.approx


def tiny(name, **knobs):
    return {"scheduler": {"name": name, "block_size": 4, "num_kv_blocks": 16, **knobs},
            "executor": {"name": "sim"}, "model": dict(TINY_MODEL),
            "hardware": dict(INSTANT_HW), "progress": False}


@pytest.fixture
def plugin_path(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "experiments" / "ablation"))


@pytest.mark.parametrize("ff", [True, False])
def test_chunking_only_never_mixes_a_chunk_with_decodes(plugin_path, ff):
    """Budget 4, 0.01 s an iteration; a (4 prompt, 3 output) at 0, b (8, 2) at 0.005:
    it1 a's prompt         a1 at 0.01     it2 a decodes          a2 at 0.02
    it3 b's first chunk of 4 (a waits)    it4 a decodes          a3 at 0.04, a ends
    it5 b's last chunk      b1 at 0.05     it6 b decodes          b2 at 0.06, b ends
    (Sarathi would run b's chunks beside a's decodes.)"""
    policy, ex = build(tiny("simple_chunking:SimpleChunking", token_budget=4))
    a, b = Request(0, 0.0, 4, 3), Request(1, 0.005, 8, 2)
    eng = Engine(policy, ex, fast_forward=ff)
    eng.run([a, b])
    it = iterations_table(eng.iterations())
    assert list(zip(it["prefill_tokens"], it["decode_tokens"])) == \
        [(4, 0), (0, 1), (4, 0), (0, 1), (4, 0), (0, 1)]
    assert a.token_times == approx([0.01, 0.02, 0.04])
    assert b.token_times == approx([0.05, 0.06])
    # the same requests under Sarathi: b's chunks ride with a's decodes
    policy, ex = build(tiny("sarathi", token_budget=4))
    eng = Engine(policy, ex)
    eng.run([Request(0, 0.0, 4, 3), Request(1, 0.005, 8, 2)])
    it = iterations_table(eng.iterations())
    assert ((it["prefill_tokens"] > 0) & (it["decode_tokens"] > 0)).any()


def test_chunking_only_settings_are_checked(plugin_path):
    with pytest.raises(ValueError, match="token_budget"):
        build(tiny("simple_chunking:SimpleChunking", token_budget=0))


def test_ablation_study_at_toy_scale(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))   # restored after
    study = load_study("ablation")
    runs, cells = study.run_study(tmp_path, tmp_path / "out", [0, 1], ["sharegpt"],
                                  ["trace.num_requests=16"])
    assert len(runs) == len(study.ARMS) * 2 and set(runs["arm"]) == set(study.ARMS)
    assert (runs["num_finished"] == 16).all() and (runs["qps"] == 1.0).all()
    budgets = runs.groupby("arm")["token_budget"].first()
    assert budgets["hybrid_only"] == 8192 and budgets["both"] == 512
    assert budgets["chunking_only"] == 512
    for arm in ("chunking_only", "both"):
        d = tmp_path / "sweeps" / f"ablation_sharegpt_{arm}"
        dirs = [p.parent for p in d.glob("*/summary.json")]
        assert len(dirs) == 2
        s = json.loads((dirs[0] / "summary.json").read_text())
        assert s["config"]["model"]["max_model_len"] == 8192
        assert s["config"]["executor"]["tensor_parallel"] == 2
        mixed = sum(((it["prefill_tokens"] > 0) & (it["decode_tokens"] > 0)).sum()
                    for it in (pd.read_parquet(p / "iterations.parquet") for p in dirs))
        if arm == "chunking_only":
            assert s["config"]["scheduler"]["name"] == "simple_chunking:SimpleChunking"
            assert mixed == 0
        else:
            assert mixed > 0
    for _, c in cells.iterrows():
        r = runs[(runs["arm"] == c["arm"]) & (runs["trace"] == c["trace"])
                 & (runs["qps"] == c["qps"])]
        assert c["ttft_p50_mean"] == approx(r["ttft_p50"].mean())
        assert c["tbt_p99_max"] == r["tbt_p99"].max() and c["tbt_p99_seeds"] == 2
    assert (tmp_path / "out" / "ablation.png").stat().st_size > 1000
