"""cluster=disagg from the command line: the run contract with per-request pools and transfers,
per-pool policies and parallelism, settings typed and checked per pool, nothing unread, and the
config file mirroring the config classes."""
import dataclasses
import json

import pandas as pd
import pytest
from helpers import cli, composed, defaults

from sarathi_lab.cli.main import check_config
from sarathi_lab.registry import router_class
from sarathi_lab.run.runner import run
from sarathi_lab.run.settings import ClusterConfig
from sarathi_lab.settings import ConfigError
from sarathi_lab.topology.disagg import DisaggConfig

ROUTERS = ["round_robin", "least_loaded", "power_of_two", "prefix_affinity"]
SMALL = ("trace=synthetic", "trace.num_requests=40", "trace.qps=8", "progress=false")


@pytest.mark.slow   # a CLI subprocess
def test_cli_runs_disaggregated_pools_and_writes_the_run_contract(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/run", *SMALL, "cluster=disagg", "slo=distserve-chat-13b",
            "cluster.prefill.num_replicas=2", "cluster.prefill.router=least_loaded",
            "cluster.prefill.scheduler.name=vllm", "cluster.decode.num_replicas=3",
            "cluster.decode.executor.tensor_parallel=2", "cluster.link=nvlink", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = tmp_path / "run"
    reqs = pd.read_parquet(d / "requests.parquet")
    its = pd.read_parquet(d / "iterations.parquet")
    s = json.loads((d / "summary.json").read_text())
    assert s["num_finished"] == 40
    assert set(reqs["prefill_replica"]) == {0, 1} and set(reqs["decode_replica"]) <= {0, 1, 2}
    moved = reqs["decode_replica"] >= 0
    assert (reqs.loc[moved, "transfer_bytes"] ==
            reqs.loc[moved, "num_prompt_tokens"] * 32 * 2 * 8 * 128 * 2).all()   # Mistral-7B
    assert set(its["pool"]) == {"prefill", "decode"} and its["start"].is_monotonic_increasing
    assert s["num_gpus"] == 2 * 1 + 3 * 2
    assert s["slo"]["goodput_rps_per_gpu"] == pytest.approx(s["slo"]["goodput_rps"] / 8)
    pre, dec = s["pools"]["prefill"], s["pools"]["decode"]
    assert (pre["policy"], pre["router"], pre["num_replicas"]) == ("vllm", "least_loaded", 2)
    assert (dec["policy"], dec["tensor_parallel"], dec["num_gpus"]) == ("sarathi", 2, 6)
    assert sum(pre["requests_per_replica"]) == 40
    assert pre["num_iterations"] + dec["num_iterations"] == s["num_iterations"] == len(its)
    assert s["transfer"]["link"] == {"kind": "nvlink", "bandwidth": 300e9, "eff": 0.51,
                                     "latency_s": 3.1e-5}
    assert (s["transfer"]["tp_prefill"], s["transfer"]["tp_decode"]) == (1, 2)
    assert s["transfers"]["num_transfers"] == int(moved.sum())
    st = s["settings"]["disagg"]
    assert st["prefill"]["scheduler"]["class"] == "sarathi_lab.schedulers.vllm:VLLM"
    assert st["decode"]["scheduler"]["token_budget"] == 512
    assert st["decode"]["executor"]["tensor_parallel"] == 2
    assert st["prefill"]["cluster"] == {"num_replicas": 2,
                                        "router": "sarathi_lab.topology.routers:LeastLoaded",
                                        "load": "tokens"}
    assert "prefill pool: 2 x TP1 (vllm, router least_loaded)" in r.stdout
    assert "decode pool: 3 x TP2 (sarathi, router round_robin)" in r.stdout
    assert "link nvlink: 153 GB/s per GPU" in r.stdout and "per GPU)" in r.stdout


def test_a_pool_setting_overrides_the_runs_and_the_other_pool_keeps_it():
    r = check_config(composed("cluster=disagg", "scheduler.token_budget=256",
                              "cluster.decode.scheduler.token_budget=1024",
                              "cluster.prefill.scheduler.max_num_seqs=8"),
                     ["cluster=disagg", "scheduler.token_budget=256",
                      "cluster.decode.scheduler.token_budget=1024",
                      "cluster.prefill.scheduler.max_num_seqs=8"])
    pre, dec = r.disagg.prefill.resolved, r.disagg.decode.resolved
    assert (pre.policy_cfg.token_budget, pre.policy_cfg.max_num_seqs) == (256, 8)
    assert (dec.policy_cfg.token_budget, dec.policy_cfg.max_num_seqs) == (1024, 128)
    assert r.policy_cfg is pre.policy_cfg     # the run's own fields are the prefill pool's


@pytest.mark.parametrize("overrides, match", [
    (["cluster.link=ib"], r"^cluster\.link='ib': must be one of nvlink, net, pcie"),
    (["cluster.link_bandwidth=0"], r"^cluster\.link_bandwidth=0(\.0)?: must be > 0"),
    (["cluster.link_eff=1.5"], r"^cluster\.link_eff=1\.5: must be <= 1"),
    (["cluster.transfer=chunked"], r"^cluster\.transfer='chunked': must be one of whole, "),
    (["cluster.prefill.num_replicas=0"], r"^cluster\.prefill\.num_replicas=0: must be >= 1"),
    (["cluster.decode.router=least_loaded"],
     r"^cluster\.decode\.router: read only with cluster\.decode\.num_replicas > 1"),
    (["cluster.decode.num_replicas=2", "cluster.decode.router=least_loaded",
      "cluster.decode.load=bytes"], r"^cluster\.decode\.load='bytes': must be one of"),
    (["cluster.decode.num_replicas=2", "cluster.decode.router=nope"],
     r"^cluster\.decode\.router: unknown router 'nope'"),
    (["+cluster.decode.scheduler.budget=5"],
     r"^cluster\.decode\.scheduler\.budget: not a setting of policy 'sarathi'"),
    (["cluster.prefill.scheduler.name=nope"], r"^cluster\.prefill\.scheduler\.name: unknown"),
    (["cluster.prefill.scheduler.name=vllm", "cluster.prefill.scheduler.token_budget=64"],
     r"^cluster\.prefill\.scheduler\.token_budget: not a setting of policy 'vllm'"),
    (["cluster.decode.executor.tensor_parallel=0"],
     r"^cluster\.decode\.executor\.tensor_parallel=0: must be >= 1"),
    (["scheduler.token_budget=256", "cluster.prefill.scheduler.name=vllm",
      "cluster.decode.scheduler.name=vllm"],
     r"^scheduler\.token_budget: read by neither pool's policy"),
    (["scheduler.num_kv_blocks=0"], r"^scheduler\.num_kv_blocks=0: must be >= 1 .*\(in the "
                                    r"prefill pool\)$"),
    (["cluster.decode.scheduler.enable_prefix_caching=true"],
     r"^cluster\.decode\.scheduler\.enable_prefix_caching=true: the decode pool"),
    (["executor=torch", "model=tiny-llama"],
     r"^executor\.name: TorchExecutor runs a real model; disaggregated pools need a simulated"),
    (["+cluster.decode.executor.pipeline_parallel=2"],
     r"^executor\.pipeline_parallel=2 \(in the decode pool\): disaggregated pools run one "
     r"engine per replica"),
    (["executor.pipeline_parallel=2"], r"^executor\.pipeline_parallel=2 \(in the prefill pool\)"),
])
def test_bad_disagg_settings_name_the_setting(overrides, match):
    ov = ["cluster=disagg", *overrides]
    with pytest.raises(ConfigError, match=match):
        check_config(composed(*ov), ov)


def test_unread_settings_are_left_out_in_a_multirun():
    ov = ["cluster=disagg", "cluster.decode.router=least_loaded", "scheduler.token_budget=256",
          "cluster.prefill.scheduler.name=vllm", "cluster.decode.scheduler.name=vllm"]
    r = check_config(composed(*ov), ov, multirun=True)
    assert r.disagg is not None and r.disagg.decode.resolved.router_cls is None
    assert r.notes == [
        "cluster.router: read only with cluster.num_replicas > 1 (a fleet)",
        "scheduler.token_budget: read by neither pool's policy"]


def test_the_split_is_part_of_the_effective_configuration():
    def eff(*ov):
        return check_config(composed("cluster=disagg", *ov)).effective()
    one = eff()
    assert "scheduler" not in one and one["disagg"]["link"] == "net"
    assert one["disagg"]["prefill"]["cluster"] == {"num_replicas": 1}
    assert eff("cluster.prefill.num_replicas=2") != one
    assert eff("cluster.link=pcie") != one
    assert eff("cluster.decode.executor.tensor_parallel=2") != one
    assert eff("cluster.decode.scheduler.token_budget=1024") != one
    assert check_config(composed()).effective() != one


def test_disagg_file_mirrors_the_config_classes():
    node = composed("cluster=disagg")["cluster"]
    own = defaults(DisaggConfig)
    assert {k: node[k] for k in own} == own
    knobs = set().union(*(defaults(router_class(n).config_class) for n in ROUTERS))
    fleet = defaults(ClusterConfig)
    for pool in ("prefill", "decode"):
        p = node[pool]
        assert {k: p[k] for k in fleet} == fleet
        assert set(p) == set(fleet) | knobs | {"scheduler", "executor"}
        assert all(p[k] is None for k in knobs)
        assert all(v is None for v in p["scheduler"].values())
        assert all(v is None for v in p["executor"].values())
    assert set(node) == set(own) | {"prefill", "decode"}
    fields = {f.name for f in dataclasses.fields(DisaggConfig)}
    assert fields == set(own)


def test_capacity_search_runs_on_disaggregated_pools(tmp_path):
    c = composed("cluster=disagg", "mode=capacity", "slo=distserve-chat-13b", "trace=synthetic",
                 "trace.num_requests=30", "capacity.criteria=[attainment]",
                 "capacity.qps_low=0.5", "capacity.qps_high=4", "capacity.precision=0.2",
                 "progress=false", "cluster.decode.num_replicas=2")
    from sarathi_lab.sweeps.capacity import search
    crit = search(c, tmp_path)["criteria"]["attainment"]
    assert crit["bracketed"] and 0.5 <= crit["capacity_qps"] < crit["fails_at_qps"]
    # per GPU: the prefill replica's and both decode replicas'; the cost on all three
    assert crit["num_gpus"] == 3
    assert crit["capacity_qps_per_gpu"] == pytest.approx(crit["capacity_qps"] / 3)
    from sarathi_lab.metrics import cost_at_rate
    s = run({**c, "mode": "run", "trace": {**c["trace"], "qps": crit["capacity_qps"]}}, None,
            write=False)
    assert s["pools"]["decode"]["num_replicas"] == 2 and s["num_gpus"] == 3
    mean_out = s["offered_load"]["output_tokens_per_s"] / s["offered_load"]["requests_per_s"]
    assert crit["usd_per_1m_output_tokens"] == pytest.approx(
        cost_at_rate(crit["capacity_qps"], mean_out, 1.8, 3)["usd_per_1m_output_tokens"],
        rel=0.05)
