"""The chunking-overhead study (experiments/chunk_overhead/run.py) at toy scale: every source in
the table, chunking never predicted cheaper than one piece by either cost model, and the ratio
arithmetic by hand."""
import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import slow_fixture
from study_scripts import load_study

pytestmark = pytest.mark.slow   # a study at toy scale

C = load_study("chunk_overhead")


def test_ratios_by_hand():
    # measured in three rounds: per-round ratios 3/2, 5/2.5, 4/1 -> median 2, range 1.5-4
    rows = [dict(source="m", kind="measured", chunk=c, seconds=s, iterations=n, round=r)
            for c, s, n, r in ((64, 3.0, 2, 0), (64, 5.0, 2, 1), (64, 4.0, 2, 2),
                               (128, 2.0, 1, 0), (128, 2.5, 1, 1), (128, 1.0, 1, 2))] + \
        [dict(source="r", kind="roofline", chunk=64, seconds=1.5, iterations=2),
         dict(source="r", kind="roofline", chunk=128, seconds=1.0, iterations=1)]
    t = C.table(rows, 128).set_index(["source", "chunk"])
    m64 = t.loc[("m", 64)]
    assert m64.seconds == 4.0 and m64.seconds_min == 3.0 and m64.repeats == 3
    assert m64.spread == pytest.approx((5 - 3) / 4)
    assert m64.ratio == pytest.approx(2.0)
    assert (m64.ratio_lo, m64.ratio_hi) == pytest.approx((1.5, 4.0))
    assert t.loc[("m", 128)].ratio == 1.0 and t.loc[("r", 64)].ratio == pytest.approx(1.5)
    md = C.markdown(t.reset_index())
    assert "| 64 | 2.000 (1.50-4.00; ±50%) | 1.500 |" in md
    assert "| one piece (s) | 2 | 1 |" in md


@slow_fixture(scope="module")
def toy(tmp_path_factory):
    n = torch.get_num_threads()
    out = tmp_path_factory.mktemp("chunk_overhead")
    t = C.study(out, toy=True, repeats=1, log=lambda *_: None)
    torch.set_num_threads(n)
    return out, t


def test_toy_study_has_every_source_and_chunk(toy):
    out, t = toy
    scale = C.SCALES["toy"]
    names = C.sources(scale, out / "profile.parquet", C.VIDUR_TOY)
    assert set(t["source"]) == set(names)
    assert {k for k, *_ in names.values()} == {"measured", "roofline", "profiled"}
    for src, d in t.groupby("source"):
        assert sorted(d["chunk"]) == sorted(scale["chunks"])
        # a chunk of c tokens: ceil(P / c) prefill iterations
        assert (d["iterations"] == np.ceil(scale["prompt"] / d["chunk"])).all()
        assert (d["seconds"] > 0).all()
    per = pd.read_csv(out / "per_chunk.csv")
    for (src, chunk), d in per.groupby(["source", "chunk"]):
        # the chunks' durations add up to the table's prefill time, at contexts 0, c, 2c, ...
        row = t[(t.source == src) & (t.chunk == chunk)].iloc[0]
        assert d["seconds"].sum() == pytest.approx(row.seconds)
        assert d["context"].tolist() == list(range(0, scale["prompt"], chunk))
    assert set(per["source"]) == set(t[t.kind != "measured"]["source"])
    csv = pd.read_csv(out / "chunk_overhead.csv")
    assert len(csv) == len(names) * len(scale["chunks"])
    md = (out / "chunk_overhead.md").read_text()
    assert all(s in md for s in names)
    assert (out / "chunk_overhead.png").stat().st_size > 10_000
    info = json.loads((out / "chunk_overhead.json").read_text())
    assert info["torch_threads"] == 1 and info["profile_meta"]["threads"] == "1"


def test_chunking_never_predicts_less_than_one_piece(toy):
    _, t = toy
    predicted = t[t["kind"].isin(["roofline", "profiled"])]
    assert set(predicted["kind"]) == {"roofline", "profiled"}
    assert (predicted["ratio"] >= 1 - 1e-9).all(), predicted[predicted["ratio"] < 1]
    # the smallest chunk costs strictly more under every cost model: fixed per-iteration costs
    # and the KV re-read by later chunks are charged
    smallest = predicted[predicted["chunk"] == predicted["chunk"].min()]
    assert (smallest["ratio"] > 1.01).all()
