"""The refactor guard: recorded runs of every topology and built-in policy, replayed and compared
value for value (requests.parquet, iterations.parquet with pyarrow's `Table.equals`, and every
figure of summary.json but the wall time).

The references under tests/data/reference_runs/ were recorded from main at 5750ed7, before the
structure change. A change that is *meant* to move results (a cost model's new term, say)
records them again, and its commit says why:

    python tests/test_reference_runs.py --record            # every case
    python tests/test_reference_runs.py --record fleet_ll_sarathi_ff   # some

A refactor must leave every one of them equal.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sarathi_lab.run.rundir import json_differences

REF = Path(__file__).parent / "data" / "reference_runs"

_SMALL = ["trace=sharegpt", "trace.num_requests=60", "trace.qps=6", "progress=false", "seed=3", "name=reference"]
_CLOSED = ["trace.clients=6", "+trace.think_time={dist: exponential, mean: 0.5}"]

# name -> overrides; `_ff` / `_noff`: fast-forward on / off
CASES: dict[str, list[str]] = {}
for _p in ("request_level", "orca", "vllm", "sarathi", "sarathi_priority", "edf", "vtc"):
    for _ff in (True, False):
        CASES[f"single_{_p}_{'ff' if _ff else 'noff'}"] = [
            f"scheduler={_p}", f"fast_forward={str(_ff).lower()}", *_SMALL]
for _p in ("vllm", "sarathi"):
    for _ff in (True, False):
        tag = "ff" if _ff else "noff"
        CASES[f"closed_{_p}_{tag}"] = [f"scheduler={_p}", f"fast_forward={str(_ff).lower()}",
                                       *_SMALL, *_CLOSED]
        CASES[f"fleet_ll_{_p}_{tag}"] = [
            f"scheduler={_p}", f"fast_forward={str(_ff).lower()}", *_SMALL, "trace.qps=14",
            "cluster.num_replicas=3", "cluster.router=least_loaded"]
    CASES[f"fleet_rr_{_p}"] = [f"scheduler={_p}", *_SMALL, "trace.qps=10",
                               "cluster.num_replicas=2"]
    CASES[f"pipeline_{_p}"] = [f"scheduler={_p}", *_SMALL, "model=llama-2-70b",
                               "parallel=tp2pp2", "trace.max_total_tokens=4096", "trace.qps=3",
                               "slo=llama-2-70b-strict"]
    CASES[f"disagg_{_p}"] = [f"scheduler={_p}", *_SMALL, "cluster=disagg",
                             "cluster.prefill.num_replicas=1", "cluster.decode.num_replicas=2",
                             "cluster.decode.router=least_loaded", "trace.qps=8"]
CASES["disagg_layerwise_vllm_prefill"] = [
    *_SMALL, "cluster=disagg", "cluster.prefill.num_replicas=2", "cluster.decode.num_replicas=1",
    "cluster.prefill.scheduler.name=vllm", "cluster.transfer=layerwise", "trace.qps=8"]
CASES["single_vllm_swap"] = ["scheduler=vllm", *_SMALL, "trace.qps=20",
                             "scheduler.preemption_mode=swap", "scheduler.num_kv_blocks=300"]
CASES["single_sarathi_recompute"] = ["scheduler=sarathi", *_SMALL, "trace.qps=20",
                                     "scheduler.num_kv_blocks=300"]

NOT_COMPARED = ("wall_time_s",)


def run_case(name: str, out: Path) -> None:
    from hydra import compose, initialize_config_module

    from sarathi_lab.run.runner import run
    with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
        cfg = compose("config", overrides=CASES[name])
    run(cfg, out)


def differences(ref: Path, new: Path) -> list[str]:
    import pyarrow.parquet as pq
    out = []
    for name in ("requests.parquet", "iterations.parquet"):
        ta, tb = pq.read_table(ref / name), pq.read_table(new / name)
        if not ta.equals(tb):   # exact: schema, order, every value (NaN where NaN)
            cols = [c for c in ta.schema.names
                    if c not in tb.schema.names or not ta[c].equals(tb[c])]
            out.append(f"{name}: differs (columns {cols or 'schema/metadata'}; "
                       f"{ta.num_rows} vs {tb.num_rows} rows)")
    sa = json.loads((ref / "summary.json").read_text())
    sb = json.loads((new / "summary.json").read_text())
    for k in NOT_COMPARED:
        sa.pop(k, None)
        sb.pop(k, None)
    out += [f"summary.json{d}" for d in json_differences(sa, sb, sides=("reference", "this run"))]
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_run_equals_its_reference(name, tmp_path):
    assert (REF / name / "summary.json").exists(), \
        f"no reference for {name}: python tests/test_reference_runs.py --record {name}"
    run_case(name, tmp_path / name)
    diffs = differences(REF / name, tmp_path / name)
    assert not diffs, "\n".join(diffs[:20])


def test_every_reference_has_a_case():
    """A reference left behind by a removed case would guard nothing."""
    assert {p.name for p in REF.iterdir()} == set(CASES)


if __name__ == "__main__":
    import shutil
    if len(sys.argv) < 2 or sys.argv[1] != "--record":
        sys.exit(__doc__)
    names = sys.argv[2:] or sorted(CASES)
    for n in names:
        shutil.rmtree(REF / n, ignore_errors=True)
        run_case(n, REF / n)
        print("recorded", n)
