"""Mooncake (JSONL with block hash ids) and BurstGPT (CSV) traces (traces/mooncake.py,
traces/csv_formats.py): hash ids shared as exactly that many cache blocks, BurstGPT's filters,
errors naming the file and the row, the shipped Mooncake sample, and the CLI with each."""
import dataclasses
import json

import pytest
from conftest import LinearCost, make_policy
from helpers import CONFIGS, cli

from sarathi_lab.engine import Engine
from sarathi_lab.settings import ConfigError
from sarathi_lab.traces import build_trace, csv_formats, describe_trace, load_trace, to_requests


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def mc(t, n, out, ids):
    return {"timestamp": t, "input_length": n, "output_length": out, "hash_ids": ids}


# ---- Mooncake ----------------------------------------------------------------------------------

def test_mooncake_keeps_its_own_times_in_seconds_and_its_lengths(tmp_path):
    f = write_jsonl(tmp_path / "m.jsonl", [mc(1000, 600, 5, [1, 2]), mc(1500, 512, 0, [1]),
                                           mc(3250, 1, 7, [9])])
    df = load_trace(f)
    assert df["arrival_time"].tolist() == [0.0, 0.5, 2.25]
    assert df["num_prompt_tokens"].tolist() == [600, 512, 1]
    assert df["num_output_tokens"].tolist() == [5, 0, 7]
    ids = df["prompt_token_ids"].tolist()
    assert [len(x) for x in ids] == [600, 512, 1]
    assert ids[1] == ids[0][:512]              # hash id 1: the same 512 ids in both
    assert ids[0][512:] != ids[1][:88]         # hash id 2 is another block
    assert df.attrs["format"] == "mooncake" and df.attrs["arrivals"] == "own"


@pytest.mark.parametrize("block_size, shared_ids, blocks", [
    (16, 2, 2 * 512 // 16), (512, 2, 2), (64, 3, 3 * 512 // 64),
    (1024, 3, 1),   # a block size that does not divide 512: floor(3 * 512 / 1024)
])
def test_shared_hash_ids_are_exactly_that_many_shared_cache_blocks(tmp_path, block_size,
                                                                   shared_ids, blocks):
    """Two requests opening with the same `shared_ids` hash ids, then different ones: the
    second finds exactly shared_ids * 512 / block_size blocks in the prefix cache."""
    head = list(range(100, 100 + shared_ids))
    f = write_jsonl(tmp_path / "m.jsonl", [mc(0, 512 * shared_ids + 300, 2, head + [1]),
                                           mc(60000, 512 * shared_ids + 400, 2, head + [2])])
    policy = make_policy("sarathi", token_budget=4096, block_size=block_size, num_blocks=200,
                         max_model_len=8192, enable_prefix_caching=True)
    engine = Engine(policy, LinearCost(0.01, 0.0))
    reqs = to_requests(load_trace(f))
    engine.run(reqs)
    assert reqs[0].finish_time < reqs[1].arrival_time
    stats = engine.kv.prefix_cache_stats()
    assert stats["hit_tokens"] == blocks * block_size
    assert stats["query_tokens"] == reqs[0].num_prompt_tokens + reqs[1].num_prompt_tokens


@pytest.mark.parametrize("rows, message", [
    ([mc(0, 10, 1, [1]), {"timestamp": 5, "input_length": 10, "output_length": 1}],
     r"line 2: missing hash_ids \(a Mooncake trace line has timestamp, input_length"),
    ([mc(0, 10, -1, [1])], "line 1: output_length must be a whole number of tokens >= 0, "
                           "got -1"),
    ([mc(0, 0, 1, [])], "line 1: input_length must be a whole number of tokens >= 1, got 0"),
    ([mc(0, 10, 1, [1]), mc(50, 10, 1, [2]), mc(40, 10, 1, [3])],
     r"line 3: timestamp 40 ms comes before the previous request's \(50 ms\)"),
    ([mc(0, 10, 1, [1]), mc(1e20, 10, 1, [2])], "line 2: the request arrives at t=1e[+]17 s"),
    ([mc(-5, 10, 1, [1])], "line 1: timestamp must be a number of milliseconds >= 0, got -5"),
    ([mc(0, 10, 1, [1]), mc(1, 1025, 1, [1, 2])],
     "line 2: 2 hash_ids, but input_length=1025 takes 3 blocks of 512 tokens"),
    ([mc(True, 10, 1, [1])], "line 1: timestamp must be a number"),
    ([mc(0, 10, 1, [1, "a"])], "line 1: hash_ids must be a list of non-negative ints"),
])
def test_bad_mooncake_lines_are_named(tmp_path, rows, message):
    f = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=f"trace {f}: {message}"):
        load_trace(f)


def test_the_shipped_mooncake_sample():
    df = load_trace("mooncake")
    assert len(df) == 300 and df.attrs["source"] == "shipped:mooncake"
    assert df["arrival_time"].iloc[0] == 0.0 and df["arrival_time"].is_monotonic_increasing
    assert df["arrival_time"].iloc[-1] == 102.0   # its last timestamp, 102000 ms
    ids = df["prompt_token_ids"]
    assert ids[0][:512] == ids[1][:512]   # both open with hash id 0 (its first lines' prefix)
    assert ids[0][512:1024] != ids[1][512:1024]


# ---- BurstGPT ----------------------------------------------------------------------------------

BURST = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
7,ChatGPT,0,20,20,Conversation log
45,GPT-4,1087,230,1317,API log
118,GPT-4,417,276,693,Conversation log
130.5,ChatGPT,30,0,30,API log
"""


@pytest.fixture
def burst(tmp_path):
    f = tmp_path / "burst.csv"
    f.write_text(BURST)
    return f


@pytest.mark.parametrize("models, log_types, kept, dropped", [
    (None, None, [(0.0, 472, 18), (40.0, 1087, 230), (113.0, 417, 276)], (1, 1, 0)),
    ("ChatGPT", None, [(0.0, 472, 18)], (1, 1, 2)),
    (["gpt-4"], None, [(0.0, 1087, 230), (73.0, 417, 276)], (1, 1, 1)),   # case ignored
    (None, "API log", [(0.0, 1087, 230)], (1, 1, 2)),
    (["GPT-4", "ChatGPT"], ["conversation log"], [(0.0, 472, 18), (113.0, 417, 276)],
     (1, 1, 1)),
])
def test_burstgpt_rows_with_filters(burst, models, log_types, kept, dropped):
    """The failed call (0 response tokens, BurstGPT's mark of one) and the row of 0 request
    tokens are dropped, whatever the filters, and counted; the filters keep what they name
    among the rest; times count from the first kept request."""
    df = load_trace(burst, models=models, log_types=log_types)
    assert list(df[["arrival_time", "num_prompt_tokens", "num_output_tokens"]]
                .itertuples(index=False, name=None)) == kept
    assert df.attrs["format"] == "burstgpt"
    assert (df.attrs["failed"], df.attrs["no_prompt"], df.attrs["filtered"]) == dropped


def test_burstgpt_failed_calls_are_counted_in_the_summary_record(burst, caplog):
    caplog.set_level("INFO", logger="sarathi_lab.traces.load")
    df = build_trace({"name": "bg", "path": str(burst), "num_requests": None})
    assert describe_trace(df)["dropped_rows"] == {"failed_calls": 1, "no_prompt": 1,
                                                  "filtered": 0}
    assert "1 failed calls (0 response tokens), 1 rows of 0 request tokens" in caplog.text


def test_burstgpt_filters_before_num_requests(burst):
    df = load_trace(burst, models="GPT-4", num_requests=1)
    assert df["num_prompt_tokens"].tolist() == [1087]


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.replace(",Log Type", ",Kind"),
     "a BurstGPT trace needs the columns .* it lacks Log Type"),
    (lambda s: s.replace("Request tokens", "Req"), "missing required columns"),
    (lambda s: s.replace("1087,230", "1087,-3"),
     r"data row 3 \(line 4 of the file.*\), column 'Response tokens': -3 is not"),
    (lambda s: s.replace("118,GPT-4", "40,GPT-4"),
     r"not sorted ascending: data row 4 \(line 5 of the file\) arrives at 40.0"),
    (lambda s: s.replace("45,GPT-4", "1e300,GPT-4"),
     r"data row 3 .* column 'Timestamp': 1e\+300 is not a time in seconds, >= 0 and below"),
    (lambda s: s.replace("5,ChatGPT,472", "-5,ChatGPT,472"),
     r"data row 1 .* column 'Timestamp': -5.0 is not a time in seconds"),
])
def test_bad_burstgpt_files_are_named(tmp_path, edit, message):
    f = tmp_path / "bad.csv"
    f.write_text(edit(BURST))
    with pytest.raises(ValueError, match=f"trace {f}.*{message}"):
        load_trace(f)


def test_unsorted_times_across_chunks_name_the_files_row(burst, monkeypatch):
    monkeypatch.setattr(csv_formats, "_CHUNK_ROWS", 2)   # rows 1-2, 3-4, 5 read apart
    burst.write_text(BURST.replace("130.5,ChatGPT", "100,ChatGPT"))
    with pytest.raises(ValueError, match=r"data row 5 \(line 6 of the file\) arrives at 100.0, "
                                         r"before the previous request \(118.0\)"):
        load_trace(burst)


def test_burstgpt_filter_errors(burst):
    with pytest.raises(ValueError, match=r"Model 'GPT4' matches no row of the 5 read; its "
                                         "Model values there are ChatGPT, GPT-4"):
        load_trace(burst, models=["ChatGPT", "GPT4"])
    with pytest.raises(ValueError, match="trace.log_types: read only for a BurstGPT trace .* "
                                         "in the azure format"):
        load_trace("azure_conv", log_types="API log", num_requests=3)
    with pytest.raises(ValueError, match="trace.models: read only for a BurstGPT trace .* JSONL"):
        load_trace("mooncake", models="ChatGPT")
    with pytest.raises(ConfigError, match="trace.models='ChatGPT': read only for a BurstGPT"):
        build_trace({"path": None, "num_requests": 3, "qps": 1.0, "prompt_len": 4,
                     "output_len": 4, "models": "ChatGPT"})
    with pytest.raises(ConfigError, match="trace.path: this preset ships no trace file"):
        build_trace({"path": "???", "num_requests": 3})


# ---- the CLI -----------------------------------------------------------------------------------

@pytest.mark.slow   # CLI subprocesses
def test_cli_with_each_format(tmp_path, burst):
    r = cli("trace=mooncake", "trace.num_requests=12", "trace.max_total_tokens=32768",
            "scheduler.enable_prefix_caching=true", f"hydra.run.dir={tmp_path}/mc", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "mc" / "summary.json").read_text())
    assert s["trace"]["source"] == "shipped:mooncake" and s["num_finished"] == 12
    assert s["prefix_cache"]["hit_tokens"] > 0   # its first lines share hash id 0

    r = cli("trace=burstgpt", f"trace.path={burst}", "trace.models=GPT-4",
            f"hydra.run.dir={tmp_path}/bg", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "bg" / "summary.json").read_text())
    assert s["num_finished"] == 2 and s["trace"]["arrivals"] == "own"

    own = write_jsonl(tmp_path / "own.jsonl", [mc(0, 700, 3, [5, 6]), mc(2000, 600, 3, [5, 7])])
    r = cli(f"trace.path={own}", "scheduler.enable_prefix_caching=true",
            f"hydra.run.dir={tmp_path}/own", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "own" / "summary.json").read_text())
    assert s["prefix_cache"]["hit_tokens"] == 512 and s["num_finished"] == 2

    r = cli("trace=burstgpt", f"hydra.run.dir={tmp_path}/none", cwd=tmp_path)
    assert r.returncode != 0 and "trace.path: this preset ships no trace file" in r.stderr


def test_the_burstgpt_preset_writes_the_trace_keys_and_its_filters():
    from omegaconf import OmegaConf

    from sarathi_lab.traces import TraceConfig
    raw = OmegaConf.load(CONFIGS / "trace" / "burstgpt.yaml")
    assert set(raw.keys()) == {f.name for f in dataclasses.fields(TraceConfig)} - {
        "prompt_len", "output_len"}
    assert OmegaConf.is_missing(raw, "path")
