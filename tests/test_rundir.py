"""A run directory: one reader of its overrides (report and loggers both use it), one atomic
writer of its results."""
import json
import multiprocessing
import os

import pandas as pd
import pytest

from sarathi_lab.cli.loggers import csv_row
from sarathi_lab.report import read_overrides
from sarathi_lab.run import rundir


def hydra_dir(tmp_path, text):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(text)
    return tmp_path


def test_overrides_are_read_once_for_report_and_loggers(tmp_path):
    d = hydra_dir(tmp_path, "- scheduler=sarathi\n- scheduler.token_budget=512\n"
                            "- +trace.note=a=b\n- results_root=/x\n- logger=csv\n")
    assert rundir.overrides(d) == ["scheduler=sarathi", "scheduler.token_budget=512",
                                   "+trace.note=a=b", "results_root=/x", "logger=csv"]
    # the report keeps what was run (numbers as numbers), not how
    assert read_overrides(d) == {"scheduler": "sarathi", "scheduler.token_budget": 512,
                                 "trace.note": "a=b"}
    cfg = {"scheduler": {"name": "sarathi"}, "model": {}, "trace": {}}
    assert csv_row(cfg, d, {})["overrides"] == ",".join(rundir.overrides(d))


def test_a_directory_hydra_did_not_make_has_no_overrides(tmp_path):
    assert rundir.overrides(tmp_path) == [] and read_overrides(tmp_path) == {}
    assert rundir.overrides(hydra_dir(tmp_path, "")) == []


@pytest.mark.parametrize("text, message", [("- a=1\n  b: [", "not valid YAML"),
                                           ("a: 1\n", "expected a list of overrides, got dict")])
def test_a_damaged_overrides_file_is_named(tmp_path, text, message):
    d = hydra_dir(tmp_path, text)
    with pytest.raises(ValueError, match=f"overrides.yaml: {message}"):
        rundir.overrides(d)


def test_atomic_write_replaces_in_one_step_from_a_unique_temporary(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")
    seen, before = [], []

    def write(p):
        before.append(target.read_text())   # while writing, readers still see the old file
        seen.append(p)
        p.write_text(f"new {len(seen)}")
    rundir.atomic_write(target, write)
    rundir.atomic_write(target, write)
    assert before == ["old", "new 1"] and target.read_text() == "new 2"
    a, b = seen
    assert a != b and a.parent == b.parent == tmp_path
    assert str(os.getpid()) in a.name and a.name.endswith(".tmp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "requests.parquet"
    target.write_text("complete")

    def half(p):
        p.write_text("par")
        raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        rundir.atomic_write(target, half)
    assert target.read_text() == "complete"
    assert [p.name for p in tmp_path.iterdir()] == ["requests.parquet"]
    with pytest.raises(TypeError):      # not JSON-serialisable keys: nothing written at all
        rundir.write_json(tmp_path / "summary.json", {(1, 2): 3})
    assert [p.name for p in tmp_path.iterdir()] == ["requests.parquet"]


def _writer(args):
    path, i = args
    df = pd.DataFrame({"writer": [i] * 20000, "x": range(20000)})
    for _ in range(5):
        rundir.atomic_write(path, lambda p: df.to_parquet(p, index=False))
    return i


def test_parallel_writers_never_leave_a_mixed_or_partial_file(tmp_path):
    path = tmp_path / "iterations.parquet"
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        assert sorted(pool.map(_writer, [(path, i) for i in range(3)])) == [0, 1, 2]
    df = pd.read_parquet(path)
    assert len(df) == 20000 and df["writer"].nunique() == 1
    assert [p.name for p in tmp_path.iterdir()] == ["iterations.parquet"]


def test_write_json_round_trips(tmp_path):
    rundir.write_json(tmp_path / "capacity.json", {"a": 1.5, "p": tmp_path})
    assert json.loads((tmp_path / "capacity.json").read_text()) == {"a": 1.5, "p": str(tmp_path)}


def test_write_parquet_reads_back_as_pandas_wrote_it_with_dictionaries_only_off_floats(tmp_path):
    import numpy as np
    import pyarrow.parquet as pq
    df = pd.DataFrame({"status": ["finished", "rejected", "finished"],
                       "num_output_tokens": np.array([2, 0, 1], np.int64),
                       "ttft": [0.5, np.nan, 0.25],
                       "token_times": [np.array([1.0, 1.5]), np.array([]), np.array([2.0])]})
    rundir.write_parquet(tmp_path / "new.parquet", df)
    df.to_parquet(tmp_path / "pandas.parquet", index=False)
    new = pq.read_schema(tmp_path / "new.parquet")
    assert new.equals(pq.read_schema(tmp_path / "pandas.parquet"), check_metadata=True)
    back = pd.read_parquet(tmp_path / "new.parquet")
    pd.testing.assert_frame_equal(back.drop(columns="token_times"),
                                  df.drop(columns="token_times"))
    assert [t.tolist() for t in back["token_times"]] == [[1.0, 1.5], [], [2.0]]
    meta = pq.ParquetFile(tmp_path / "new.parquet").metadata.row_group(0)
    dictionary = {meta.column(i).path_in_schema.split(".")[0]
                  for i in range(meta.num_columns)
                  if any("DICTIONARY" in e for e in meta.column(i).encodings)}
    assert dictionary == {"status", "num_output_tokens"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.parquet", "pandas.parquet"]


def test_to_arrow_builds_float_array_columns_in_one_piece_as_pyarrow_would(tmp_path, monkeypatch):
    import numpy as np
    import pyarrow as pa
    from conftest import req

    from sarathi_lab.metrics import requests_table
    reqs = [req(0, 4, 3), req(1, 5, 2), req(2, 6, 1)]
    reqs[0].token_times, reqs[1].token_times = [1.0, 2.0, 3.5], [0.25]
    reqs[1].prompt_token_ids = [1, 2, 3, 4, 5]   # a list column of ints: pyarrow's own way
    df = requests_table(reqs)
    assert rundir._float_arrays(df["token_times"].to_numpy())
    assert not rundir._float_arrays(df["prompt_token_ids"].to_numpy())
    ref = pa.Table.from_pandas(df, preserve_index=False)
    seen = []
    monkeypatch.setattr(rundir, "_float_arrays",
                        lambda col, _f=rundir._float_arrays: seen.append(_f(col)) or seen[-1])
    got = rundir.to_arrow(df)
    # token_times in one piece; the other object columns (ids, strings) as pyarrow does them
    assert seen.count(True) == 1
    assert got.schema.equals(ref.schema, check_metadata=True) and got.equals(ref)
    assert got["token_times"].to_pylist() == [[1.0, 2.0, 3.5], [0.25], []]
    # a column holding anything else goes through pyarrow alone
    other = pd.DataFrame({"t": [np.array([1.0]), np.array([1], np.int64)]})
    assert rundir.to_arrow(other).equals(pa.Table.from_pandas(other, preserve_index=False))
    assert seen[-1] is False


def test_json_differences_by_hand():
    from sarathi_lab.run.rundir import json_differences
    nan = float("nan")
    assert json_differences({"a": [1, nan]}, {"a": [1, nan]}) == []        # NaN equals NaN
    assert json_differences({"a": 1}, {"a": 1.0}) == [".a: 1 != 1.0"]   # types count
    assert json_differences({"x": 1}, {"y": 1}, sides=("ref", "new")) == \
        [".x: only in ref", ".y: only in new"]
    assert json_differences({"l": [1, 2]}, {"l": [1, 3]}) == [".l[1]: 2 != 3"]
