"""experiments/memory at toy scale: one command writes memory.csv, fixed_load.csv and the plot;
every configuration is searched and run, and the tables agree with the runs' own files."""
import json
from pathlib import Path

import pandas as pd
import pytest
from study_scripts import load_study

pytestmark = pytest.mark.slow   # a study at toy scale


def test_memory_study_at_toy_scale(tmp_path):
    study = load_study("memory")
    # 60 requests at 4 req/s on two A100s' 2,352 blocks: the bf16 runs preempt
    rep, table, fixed = study.run_study(tmp_path, tmp_path / "out", 60, 4.0,
                                        ["capacity.max_probes=2", "capacity.qps_high=2"])
    out = tmp_path / "out"
    for f in ("memory.csv", "fixed_load.csv", "memory.png", "capacity.csv"):
        assert (out / f).stat().st_size > 0
    assert len(table) == 8 + 4 and len(fixed) == 8
    a100 = table[table["hardware"] == "a100-80gb"]
    assert set(zip(a100["policy"], a100["preemption_mode"], a100["kv_cache_dtype"])) == {
        (p, m, k) for p in ("vllm", "sarathi") for m in ("recompute", "swap")
        for k in ("bfloat16", "float8")}
    h100 = table[table["hardware"] == "h100-sxm"]
    assert set(zip(h100["weight_dtype"], h100["kv_cache_dtype"])) == {
        (w, k) for w in ("bfloat16", "float8") for k in ("bfloat16", "float8")}
    # each row is its capacity search's answer
    for _, r in rep.capacity.iterrows():
        res = json.loads((Path(r["run_dir"]) / "capacity.json").read_text())
        row = table[(table["policy"] == res["policy"])
                    & (table["hardware"] == res["config"]["hardware"]["name"])
                    & (table["preemption_mode"]
                       == res["config"]["scheduler"]["preemption_mode"])
                    & (table["weight_dtype"] == study._settings(res["config"])["weight_dtype"])
                    & (table["kv_cache_dtype"]
                       == study._settings(res["config"])["kv_cache_dtype"])]
        assert len(row) == 1 and row["capacity_qps"].iloc[0] == r["capacity_qps"]
    # fixed load: fp8 KV holds twice the blocks; recompute re-prefills, swap moves bytes
    f = fixed.set_index(["policy", "kv_cache_dtype", "preemption_mode"])
    for p in ("vllm", "sarathi"):
        assert f.loc[(p, "float8", "swap"), "kv_blocks"] >= 2 * f.loc[(p, "bfloat16", "swap"),
                                                                     "kv_blocks"]
        rec, swp = f.loc[(p, "bfloat16", "recompute")], f.loc[(p, "bfloat16", "swap")]
        assert rec["preemptions"] > 0 and rec["recomputed_tokens"] > 0
        assert rec["swap_outs"] == 0 and rec["swapped_gb_per_gpu"] == 0
        assert swp["swap_outs"] > 0 and swp["swapped_gb_per_gpu"] > 0
        assert swp["swap_outs"] + swp["fallbacks_to_recompute"] <= swp["preemptions"]
    # the table is the runs' own summaries
    csv = pd.read_csv(out / "fixed_load.csv")
    assert csv["preemptions"].tolist() == fixed["preemptions"].tolist()
