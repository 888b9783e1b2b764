"""The cost study at toy scale: the shared-system-prompt trace, both sweeps, cost.csv."""
import json
from pathlib import Path

import numpy as np
import pytest
from study_scripts import load_study

from sarathi_lab.metrics import cost_at_rate
from sarathi_lab.traces import load_trace

pytestmark = pytest.mark.slow   # a study at toy scale


def test_the_trace_shares_exactly_the_system_prompt(tmp_path):
    path = load_study("cost").write_trace(tmp_path / "t.jsonl", 5, 32)
    rows = [json.loads(ln) for ln in path.read_text().splitlines()]
    plain = load_trace("sharegpt", num_requests=5, qps=1.0)
    assert [len(r["prompt_token_ids"]) for r in rows] == (plain["num_prompt_tokens"] + 32).tolist()
    assert [r["output_len"] for r in rows] == plain["num_output_tokens"].tolist()
    heads = {tuple(r["prompt_token_ids"][:32]) for r in rows}
    assert len(heads) == 1
    # past the system prompt the prompts differ (random ids): nothing else to share
    assert len({r["prompt_token_ids"][32] for r in rows}) > 1


def test_cost_study_at_toy_scale(tmp_path):
    rep, table = load_study("cost").run_study(tmp_path, tmp_path / "out", 40, 64,
                                    ["capacity.max_probes=3", "capacity.qps_high=2"])
    cap = rep.capacity
    assert len(cap) == 4 * 2 + 2 * 2   # 4 policies x 2 SLOs, and vllm, sarathi with caching
    assert len(table) == 8
    assert set(table["policy"]) == {"request_level", "orca", "vllm", "sarathi"}
    reserving = table["policy"].isin(["request_level", "orca"])
    assert table.loc[reserving, "usd_per_1m_prefix_cache"].isna().all()
    assert table.loc[~reserving, "usd_per_1m_prefix_cache"].notna().all()
    for _, r in cap.iterrows():
        res = json.loads((Path(r["run_dir"]) / "capacity.json").read_text())
        cfg = res["config"]
        assert cfg["trace"]["path"].endswith("sharegpt_sys64.jsonl")
        caching = bool(cfg["scheduler"]["enable_prefix_caching"])
        row = table[(table["policy"] == r["policy"]) & (table["slo"] == r["slo"])].iloc[0]
        name = "prefix_cache" if caching else "no_cache"
        assert row[f"capacity_qps_{name}"] == r["capacity_qps"]
        # $/1M output tokens at capacity: the price over the tokens served at that rate
        mean_out = np.mean([max(1, json.loads(ln)["output_len"]) for ln in
                            Path(cfg["trace"]["path"]).read_text().splitlines()])
        want = cost_at_rate(r["capacity_qps"], mean_out, 1.8, 1)["usd_per_1m_output_tokens"]
        assert row[f"usd_per_1m_{name}"] == pytest.approx(want)
    assert (tmp_path / "out" / "cost.csv").exists()
    assert "capacity" in rep.plots
