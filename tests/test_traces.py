"""Trace loading, generation and conversion (sarathi_lab.traces)."""
import gzip
import json
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from sarathi_lab import traces
from sarathi_lab.traces import (SHIPPED, attach_prompt_ids, build_trace, load_trace,
                                synthetic_trace, to_requests)

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "trace"
COLUMNS = ["arrival_time", "num_prompt_tokens", "num_output_tokens"]


def gaps_cv(t):
    g = np.diff(t)
    return g.std() / g.mean()


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


# ---------------------------------------------------------------- shipped traces

# name -> (rows, mean prompt, mean output, duration in s or None), figures from SOURCES.md
SHIPPED_FACTS = {
    "azure_code": (8819, 2048, 28, 3436),
    "azure_conv": (19366, 1155, 211, 3502),
    "splitwise_code": (8819, 2048, 28, 3436),
    "splitwise_conv": (19366, 1155, 211, 3502),
    "arxiv": (28257, 2588, 291, None),
    "sharegpt": (30731, 2340, 439, None),
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_trace_rows_and_stats(name):
    rows, prompt_mean, output_mean, duration = SHIPPED_FACTS[name]
    df = load_trace(name, qps=None if duration else 2.0)
    assert list(df.columns) == COLUMNS
    assert len(df) == rows
    assert df["num_prompt_tokens"].dtype == np.int64
    assert df["num_output_tokens"].dtype == np.int64
    assert df["num_prompt_tokens"].mean() == pytest.approx(prompt_mean, abs=1)
    assert df["num_output_tokens"].mean() == pytest.approx(output_mean, abs=1)
    assert df["arrival_time"].iloc[0] == 0.0
    assert df["arrival_time"].is_monotonic_increasing
    if duration:
        assert df["arrival_time"].iloc[-1] == pytest.approx(duration, abs=1)
    assert df.attrs["source"].endswith(SHIPPED[name])
    assert df.attrs["dropped"] == 0


def test_sharegpt_matches_sarathi_serve_table2():
    df = load_trace("sharegpt", qps=1.0)
    assert df["num_prompt_tokens"].median() == pytest.approx(1730, abs=5)
    assert df["num_prompt_tokens"].quantile(0.9) == pytest.approx(5696, abs=20)
    assert df["num_output_tokens"].median() == pytest.approx(415, abs=5)
    assert df["num_output_tokens"].quantile(0.9) == pytest.approx(834, abs=5)
    assert (df["num_prompt_tokens"] + df["num_output_tokens"]).max() <= 8192


@pytest.mark.parametrize("kind", ["conv", "code"])
def test_splitwise_equals_azure(kind):
    a, s = load_trace(f"azure_{kind}"), load_trace(f"splitwise_{kind}")
    assert (a["num_prompt_tokens"].to_numpy() == s["num_prompt_tokens"].to_numpy()).all()
    assert (a["num_output_tokens"].to_numpy() == s["num_output_tokens"].to_numpy()).all()
    np.testing.assert_allclose(np.diff(a["arrival_time"]), np.diff(s["arrival_time"]), atol=1e-6)
    np.testing.assert_allclose(a["arrival_time"], s["arrival_time"], atol=1e-6)


def test_shipped_files_are_reproducible_gzip_and_attributed():
    folder = Path(traces.resolve_trace("sharegpt")).parent
    total = 0
    for fname in SHIPPED.values():
        raw = (folder / fname).read_bytes()
        total += len(raw)
        # gzip -n: no name and a zero mtime in the header, so the bytes do not depend on when
        # and from where the file was compressed.
        assert raw[4:8] == b"\0\0\0\0", fname
    assert total < 3 * 2**20
    attribution = (folder / "ATTRIBUTION.md").read_text()
    for fname in SHIPPED.values():
        assert fname in attribution
    for must in ("CC BY 4.0", "Splitwise", "MIT", "Apache"):
        assert must in attribution


def test_load_is_fast():
    best = min(_timed(lambda: load_trace("azure_conv")) for _ in range(3))
    assert best < 1.0  # typically ~0.02 s; the bound only catches per-row parsing


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---------------------------------------------------------------- arrivals and re-timing

@pytest.mark.parametrize("name", ["azure_conv", "splitwise_code"])
def test_retime_hits_target_rate_and_keeps_burstiness(name):
    own = load_trace(name, num_requests=5000)
    fast = load_trace(name, num_requests=5000, qps=10.0)
    t = fast["arrival_time"].to_numpy()
    assert t[0] == 0.0
    assert (len(t) - 1) / t[-1] == pytest.approx(10.0, rel=1e-9)
    # Same shape of bursts: gaps are proportional, so their CV is unchanged.
    assert gaps_cv(t) == pytest.approx(gaps_cv(own["arrival_time"].to_numpy()), rel=1e-9)
    assert (fast["num_prompt_tokens"] == own["num_prompt_tokens"]).all()


@pytest.mark.parametrize("arrival,cv", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 3.0)])
def test_generated_arrivals_rate_and_cv(arrival, cv):
    df = load_trace("sharegpt", num_requests=20000, qps=4.0, arrival=arrival, cv=cv, seed=1)
    t = df["arrival_time"].to_numpy()
    assert len(t) == 20000 and t[0] == 0.0 and (np.diff(t) >= 0).all()
    assert (len(t) - 1) / t[-1] == pytest.approx(4.0, rel=0.05)
    assert gaps_cv(t) == pytest.approx(cv, rel=0.1)
    syn = synthetic_trace(20000, 4.0, arrival=arrival, cv=cv, seed=2)
    assert gaps_cv(syn["arrival_time"].to_numpy()) == pytest.approx(cv, rel=0.1)


def test_length_trace_needs_qps():
    with pytest.raises(ValueError, match=r"(?s)sharegpt_8k.*qps"):
        load_trace("sharegpt")


@pytest.mark.parametrize("kwargs", [dict(qps=0), dict(qps=1.0, arrival="uniform"),
                                    dict(qps=1.0, arrival="gamma", cv=0)])
def test_bad_arrival_options(kwargs):
    with pytest.raises(ValueError):
        load_trace("arxiv", **kwargs)


# ---------------------------------------------------------------- determinism

def test_seed_determinism_and_difference():
    a = load_trace("arxiv", num_requests=500, qps=3.0, arrival="gamma", cv=2.0, seed=7)
    b = load_trace("arxiv", num_requests=500, qps=3.0, arrival="gamma", cv=2.0, seed=7)
    c = load_trace("arxiv", num_requests=500, qps=3.0, arrival="gamma", cv=2.0, seed=8)
    pd.testing.assert_frame_equal(a, b)
    assert not np.allclose(a["arrival_time"], c["arrival_time"])

    spec = dict(prompt_len={"dist": "lognormal", "mean": 800, "sigma": 0.7},
                output_len={"dist": "uniform", "low": 10, "high": 300})
    s1, s2 = synthetic_trace(500, 2.0, seed=3, **spec), synthetic_trace(500, 2.0, seed=3, **spec)
    s3 = synthetic_trace(500, 2.0, seed=4, **spec)
    pd.testing.assert_frame_equal(s1, s2)
    assert not (s1["num_prompt_tokens"] == s3["num_prompt_tokens"]).all()
    assert not np.allclose(s1["arrival_time"], s3["arrival_time"])


def test_short_runs_are_prefixes_of_long_runs():
    # Separate random streams: asking for fewer requests gives the head of the longer trace.
    spec = dict(prompt_len={"dist": "uniform", "low": 1, "high": 999},
                output_len={"trace": "arxiv"})
    long = synthetic_trace(300, 2.0, seed=5, **spec)
    short = synthetic_trace(100, 2.0, seed=5, **spec)
    pd.testing.assert_frame_equal(short, long.head(100))
    pd.testing.assert_frame_equal(load_trace("sharegpt", num_requests=50, qps=1.0),
                                  load_trace("sharegpt", num_requests=200, qps=1.0).head(50))


def test_lengths_do_not_move_arrivals():
    a = synthetic_trace(200, 2.0, prompt_len=10, output_len=10, seed=9)
    b = synthetic_trace(200, 2.0, prompt_len={"trace": "sharegpt"},
                        output_len={"trace": "sharegpt"}, seed=9)
    np.testing.assert_array_equal(a["arrival_time"], b["arrival_time"])


# ---------------------------------------------------------------- filters

def test_num_requests_takes_the_head():
    full = load_trace("azure_code")
    head = load_trace("azure_code", num_requests=100)
    assert len(head) == 100
    pd.testing.assert_frame_equal(head, full.head(100), check_like=True)


def test_max_total_tokens_filters_and_counts(caplog):
    full = load_trace("sharegpt", qps=1.0)
    total = (full["num_prompt_tokens"] + full["num_output_tokens"]).to_numpy()
    with caplog.at_level(logging.INFO, logger="sarathi_lab.traces"):
        df = load_trace("sharegpt", num_requests=1000, qps=1.0, max_total_tokens=2048)
    assert len(df) == 1000
    assert ((df["num_prompt_tokens"] + df["num_output_tokens"]) <= 2048).all()
    # Dropped = too-long rows before the 1000th kept one.
    kept_pos = np.flatnonzero(total <= 2048)[:1000]
    expected = int((total[:kept_pos[-1] + 1] > 2048).sum())
    assert expected > 0 and df.attrs["dropped"] == expected
    assert f"dropped {expected}" in caplog.text
    np.testing.assert_array_equal(df["num_prompt_tokens"],
                                  full["num_prompt_tokens"].to_numpy()[kept_pos])

    whole = load_trace("sharegpt", qps=1.0, max_total_tokens=2048)
    assert whole.attrs["dropped"] == int((total > 2048).sum())
    assert len(whole) + whole.attrs["dropped"] == len(full)


def test_filtered_timestamped_trace_keeps_real_gaps():
    full = load_trace("azure_conv")
    df = load_trace("azure_conv", max_prompt_tokens=1000)
    assert (df["num_prompt_tokens"] <= 1000).all()
    assert df.attrs["dropped"] == int((full["num_prompt_tokens"] > 1000).sum())
    kept = full[full["num_prompt_tokens"] <= 1000]
    expected = kept["arrival_time"].to_numpy() - kept["arrival_time"].iloc[0]
    np.testing.assert_allclose(df["arrival_time"], expected, atol=1e-9)


def test_filter_dropping_everything_is_an_error():
    with pytest.raises(ValueError, match="longer than max_prompt_tokens=1"):
        load_trace("azure_conv", max_prompt_tokens=1)


def test_synthetic_filter_redraws():
    df = synthetic_trace(2000, 1.0, prompt_len={"dist": "uniform", "low": 1, "high": 1000},
                         output_len=1, max_total_tokens=501, seed=0)
    assert len(df) == 2000
    assert df["num_prompt_tokens"].max() <= 500
    assert 1500 < df.attrs["dropped"] < 2500  # about half of the draws were too long


def test_chunked_reading_matches_whole_reading(monkeypatch, tmp_path):
    whole = load_trace("azure_conv", num_requests=300, max_prompt_tokens=800)
    monkeypatch.setattr(traces, "_CHUNK_ROWS", 7)
    chunked = load_trace("azure_conv", num_requests=300, max_prompt_tokens=800)
    pd.testing.assert_frame_equal(whole, chunked)
    assert whole.attrs["dropped"] == chunked.attrs["dropped"]
    # Row numbers in errors still count from the top of the file across chunks.
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    lines += [f"{i},10,5" for i in range(30)]
    lines[21] = "20,-3,5"
    p = write(tmp_path, "chunky.csv", "\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"data row 21 \(line 22"):
        load_trace(p)


# ---------------------------------------------------------------- formats and bad inputs

def test_azure_timestamps_parse_any_precision(tmp_path):
    p = write(tmp_path, "azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2023-11-16 18:17:03.9799600,10,1\n"
              "2023-11-16 18:17:04,20,2\n"
              "2023-11-16 18:17:04.5,30,3\n"
              "2023-11-16 18:17:05.0000001,40,4")
    df = load_trace(p)
    np.testing.assert_allclose(df["arrival_time"], [0.0, 0.02004, 0.52004, 1.0200401], atol=1e-9)
    assert df.attrs["format"] == "azure"


def test_gzip_and_extra_columns(tmp_path):
    p = tmp_path / "lengths.csv.gz"
    p.write_bytes(gzip.compress(b"num_prefill_tokens,num_decode_tokens,note\n5,6,a\n7,8,b\n"))
    df = load_trace(p, qps=1.0)
    assert list(df.columns) == COLUMNS
    assert df["num_prompt_tokens"].tolist() == [5, 7]
    assert df.attrs["source"] == str(p)


BAD_CSVS = {
    # name: (content, regex the message must match besides the file name)
    "missing_column.csv": ("TIMESTAMP,ContextTokens\n2023-11-16 18:00:00,5\n",
                           r"(?s)GeneratedTokens.*found|columns are \(TIMESTAMP, ContextTokens\)"),
    "negative.csv": ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1,6,6\n2,7,-1\n",
                     r"data row 3 \(line 4.*'num_decode_tokens'"),
    "nan.csv": ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1,,6\n",
                r"data row 2 \(line 3.*'num_prefill_tokens'"),
    "fraction.csv": ("num_prefill_tokens,num_decode_tokens\n5,5\n6.5,6\n",
                     r"data row 2 \(line 3.*'num_prefill_tokens'"),
    "text.csv": ("num_prefill_tokens,num_decode_tokens\n5,5\n6,many\n",
                 r"data row 2 \(line 3.*'num_decode_tokens'.*many"),
    "zero_prompt.csv": ("num_prefill_tokens,num_decode_tokens\n5,5\n6,6\n0,6\n",
                        r"data row 3 \(line 4.*0 tokens"),
    "unsorted.csv": ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.1,5,5\n"
                     "2023-11-16 18:00:00.3,5,5\n2023-11-16 18:00:00.2,5,5\n",
                     r"not sorted.*data row 3 \(line 4"),
    "unsorted_vidur.csv": ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n2,5,5\n"
                           "3,5,5\n1,5,5\n", r"not sorted.*data row 4 \(line 5"),
    "bad_time.csv": ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,5,5\n"
                     "yesterday,5,5\n", r"data row 2 \(line 3.*'TIMESTAMP'.*yesterday"),
    "empty.csv": ("", r"empty"),
    "header_only.csv": ("arrived_at,num_prefill_tokens,num_decode_tokens\n", r"no requests"),
}


@pytest.mark.parametrize("fname", sorted(BAD_CSVS))
def test_bad_csv_is_a_clear_error(tmp_path, fname):
    content, pattern = BAD_CSVS[fname]
    p = write(tmp_path, fname, content)
    with pytest.raises(ValueError, match=pattern) as err:
        load_trace(p, qps=1.0)
    assert fname in str(err.value)


def test_missing_column_message_names_needs_and_found(tmp_path):
    p = write(tmp_path, "two.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:00:00,5\n")
    msg = str(pytest.raises(ValueError, load_trace, p).value)
    assert "two.csv" in msg
    assert "GeneratedTokens" in msg and "num_decode_tokens" in msg  # what it needs
    assert "(TIMESTAMP, ContextTokens)" in msg  # what it found


def test_unknown_names_and_paths():
    with pytest.raises(ValueError, match="azure_conv.*sharegpt|sharegpt.*azure_conv"):
        load_trace("sharegpt4")
    with pytest.raises(FileNotFoundError, match="nowhere.csv"):
        load_trace("/nowhere.csv")


# ---------------------------------------------------------------- JSONL

def test_jsonl_round_trips_into_requests(tmp_path):
    rows = [{"prompt_token_ids": [1, 2, 3], "output_len": 4, "arrival_time": 10.0},
            {"prompt_token_ids": [7], "output_len": 1, "arrival_time": 10.5},
            {"prompt_token_ids": [5, 5, 5, 5, 9], "output_len": 0, "arrival_time": 12.0}]
    p = write(tmp_path, "reqs.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    df = load_trace(p)
    assert list(df.columns) == COLUMNS + ["prompt_token_ids"]
    np.testing.assert_allclose(df["arrival_time"], [0.0, 0.5, 2.0])
    reqs = to_requests(df, max_tokens=64)
    assert [r.request_id for r in reqs] == [0, 1, 2]
    assert [r.prompt_token_ids for r in reqs] == [r["prompt_token_ids"] for r in rows]
    assert [r.num_prompt_tokens for r in reqs] == [3, 1, 5]
    assert [r.take_output_len() for r in reqs] == [4, 1, 1]   # 0 runs as 1
    assert [r.arrival_time for r in reqs] == [0.0, 0.5, 2.0]
    assert all(r.max_tokens == 64 for r in reqs)


def test_jsonl_without_times_and_with_text(tmp_path):
    class WordTokenizer:  # stands in for a local Hugging Face tokenizer
        def __call__(self, texts):
            return {"input_ids": [[len(w) for w in t.split()] for t in texts]}

    p = tmp_path / "text.jsonl.gz"
    p.write_bytes(gzip.compress(b'{"prompt": "hello big world", "output_len": 3}\n'
                                b'{"prompt_token_ids": [4, 4], "output_len": 2}\n'))
    with pytest.raises(ValueError, match="qps"):
        load_trace(p, tokenizer=WordTokenizer())
    with pytest.raises(ValueError, match="tokenizer"):
        load_trace(p, qps=1.0)
    df = load_trace(p, qps=1.0, tokenizer=WordTokenizer())
    assert df["prompt_token_ids"].tolist() == [[5, 3, 5], [4, 4]]
    assert df["num_prompt_tokens"].tolist() == [3, 2]


@pytest.mark.parametrize("lines,pattern", [
    (['{"prompt_token_ids": [1], "output_len": 2}', '{"prompt_token_ids": [1]}'],
     r"line 2.*output_len"),
    (['{"prompt_token_ids": [1], "output_len": -2}'], r"line 1.*output_len"),
    (['{"prompt_token_ids": [], "output_len": 2}'], r"line 1.*0 tokens"),
    (['{"output_len": 2}'], r"line 1.*prompt_token_ids"),
    (['{"prompt_token_ids": [1], "output_len": 2', ''], r"line 1.*JSON"),
    (['{"prompt_token_ids": [1], "output_len": 2, "arrival_time": 3}',
      '{"prompt_token_ids": [1], "output_len": 2, "arrival_time": 1}'], r"not sorted.*line 2"),
    (['{"prompt_token_ids": [1], "output_len": 2, "arrival_time": 3}', '',
      '{"prompt_token_ids": [1], "output_len": 2}'], r"line 3.*every line or on none"),
    ([''], r"no requests"),
])
def test_bad_jsonl(tmp_path, lines, pattern):
    p = write(tmp_path, "bad.jsonl", "\n".join(lines))
    with pytest.raises(ValueError, match=pattern) as err:
        load_trace(p, qps=1.0)
    assert "bad.jsonl" in str(err.value)


# ---------------------------------------------------------------- requests and prompt ids

def test_to_requests_from_length_trace():
    df = load_trace("arxiv", num_requests=20, qps=2.0)
    reqs = to_requests(df)
    assert [r.request_id for r in reqs] == list(range(20))
    assert all(r.prompt_token_ids is None and r.max_tokens is None for r in reqs)
    assert [r.num_prompt_tokens for r in reqs] == df["num_prompt_tokens"].tolist()
    assert [r.arrival_time for r in reqs] == df["arrival_time"].tolist()


def test_attach_prompt_ids_shares_exactly_the_prefix():
    df = synthetic_trace(50, 1.0, prompt_len={"dist": "uniform", "low": 1, "high": 200},
                         output_len=5, seed=1)
    out = attach_prompt_ids(df, vocab_size=32000, seed=2, shared_prefix_len=64)
    assert "prompt_token_ids" not in df  # the input is not modified
    ids = out["prompt_token_ids"].tolist()
    assert [len(x) for x in ids] == df["num_prompt_tokens"].tolist()
    assert all(0 <= t < 32000 for x in ids for t in x)
    long = [x for x in ids if len(x) > 64]
    short = [x for x in ids if len(x) <= 64]
    assert len(long) > 10 and short
    prefix = long[0][:64]
    assert all(x[:64] == prefix for x in long)
    assert all(x == prefix[:len(x)] for x in short)
    assert len({x[64] for x in long}) > 1  # the shared part ends exactly at 64
    reqs = to_requests(out)
    assert reqs[3].prompt_token_ids == ids[3]

    again = attach_prompt_ids(df, vocab_size=32000, seed=2, shared_prefix_len=64)
    assert again["prompt_token_ids"].tolist() == ids
    plain = attach_prompt_ids(df, vocab_size=32000, seed=2)["prompt_token_ids"].tolist()
    assert len({x[0] for x in plain}) > 40  # no shared prefix without asking
    # A trace that already has ids keeps them.
    kept = attach_prompt_ids(out, vocab_size=32000, seed=99)
    assert kept["prompt_token_ids"].tolist() == ids
    with pytest.raises(ValueError, match="vocabulary"):
        attach_prompt_ids(out, vocab_size=10)


# ---------------------------------------------------------------- synthetic specs

def test_synthetic_length_specs():
    fixed = synthetic_trace(100, 1.0, prompt_len=321, output_len=7)
    assert set(fixed["num_prompt_tokens"]) == {321} and set(fixed["num_output_tokens"]) == {7}
    uni = synthetic_trace(20000, 1.0, prompt_len={"dist": "uniform", "low": 10, "high": 20},
                          output_len={"dist": "lognormal", "mean": 300, "sigma": 0.8})
    assert uni["num_prompt_tokens"].min() == 10 and uni["num_prompt_tokens"].max() == 20
    assert uni["num_output_tokens"].mean() == pytest.approx(300, rel=0.03)
    assert uni["num_output_tokens"].min() >= 1
    assert list(uni.columns) == COLUMNS and uni["num_output_tokens"].dtype == np.int64


def test_synthetic_trace_spec_keeps_rows_together():
    src = load_trace("sharegpt", qps=1.0)
    pairs = set(zip(src["num_prompt_tokens"], src["num_output_tokens"]))
    df = synthetic_trace(500, 1.0, prompt_len={"trace": "sharegpt"},
                         output_len={"trace": "sharegpt"})
    assert all(p in pairs for p in zip(df["num_prompt_tokens"], df["num_output_tokens"]))
    assert df["num_prompt_tokens"].nunique() > 300


@pytest.mark.parametrize("spec", [0, {"dist": "uniform", "low": 5, "high": 4},
                                  {"dist": "zipf"}, "long", {"trace": "nope"}])
def test_bad_length_spec(spec):
    with pytest.raises(ValueError):
        synthetic_trace(10, 1.0, prompt_len=spec, output_len=5)


# ---------------------------------------------------------------- config group

SCHEMA = {"name", "path", "num_requests", "qps", "arrival", "cv", "max_total_tokens",
          "max_prompt_tokens", "seed"}


@pytest.mark.parametrize("option", sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
def test_config_group_builds(option):
    raw = OmegaConf.load(CONFIG_DIR / f"{option}.yaml")
    extra = {"prompt_len", "output_len"} if option == "synthetic" else set()
    assert set(raw.keys()) == SCHEMA | extra
    root = OmegaConf.create({"seed": 11, "trace": raw})
    df = build_trace(root.trace)
    assert list(df.columns) == COLUMNS
    assert len(df) == root.trace.num_requests
    assert df.attrs["name"] == option
    pd.testing.assert_frame_equal(df, build_trace(OmegaConf.to_container(root.trace, resolve=True)))


def test_config_group_covers_every_shipped_trace():
    assert {p.stem for p in CONFIG_DIR.glob("*.yaml")} == set(SHIPPED) | {"synthetic"}


def test_build_trace_overrides():
    cfg = {"name": "x", "path": "azure_conv", "num_requests": 200, "qps": 20.0,
           "arrival": "poisson", "cv": 1.0, "max_total_tokens": 3000, "max_prompt_tokens": None,
           "seed": 0}
    df = build_trace(cfg)
    t = df["arrival_time"].to_numpy()
    assert len(df) == 200 and (len(t) - 1) / t[-1] == pytest.approx(20.0)
    assert ((df["num_prompt_tokens"] + df["num_output_tokens"]) <= 3000).all()
    with pytest.raises(ValueError, match="qps"):
        build_trace({**cfg, "path": None, "qps": None, "prompt_len": 5, "output_len": 5})


def test_zero_output_rows_become_one_token_requests(tmp_path, caplog):
    path = tmp_path / "zero.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,0\n1.0,10,5\n")
    reqs = to_requests(load_trace(str(path)))
    assert [r.take_output_len() for r in reqs] == [1, 5]
    assert "0 output tokens" in caplog.text


def test_a_file_that_is_not_csv_names_itself(tmp_path):
    bad = tmp_path / "notes.csv"
    bad.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,2\n1,2,3,4,5\n")
    with pytest.raises(ValueError, match=r"notes\.csv is not a readable CSV.*line 3"):
        load_trace(str(bad))
